"""GEMM shape sets of the benchmarks (docs/design.md section 7).

A shape is ``Shape(layer, m, n, k)``: ``out[M, N] = A[M, K] @ B[N, K].T``, M = tokens in the batch,
N x K = the weight of one linear layer (``nn.Linear(K, N)``).

- ``design``: the Llama-3 8B and 70B linear layers at M in 1 .. 8192, plus three extra shapes (68).
- ``judged``: the 27 shapes of ``design`` with M >= 2048 (the large-M set the kernel is judged on).
- ``five``: five large shapes for quick A/B checks.
- ``decode``: qkv, o, gate_up and down of ten served models (0.5B to 70B) at M = 1, 2, 4, ..., 1024,
  derived from each model's real dimensions (:data:`DECODE_MODELS`).
- ``quick``: a few shapes of each regime, for a smoke run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """One GEMM: ``layer`` names the linear layer (e.g. ``"Llama-3.1-8B down"``)."""

    layer: str
    m: int
    n: int
    k: int

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a decoder model that fix its linear layers' shapes (``config.json`` names:
    hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim)."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    def linear_nk(self) -> list[tuple[str, int, int]]:
        """``[(layer, N, K), ...]`` for the fused qkv projection, o, the fused gate_up projection and
        down, as a server that fuses q/k/v and gate/up runs them."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return [(f"{self.name} qkv", q + 2 * kv, self.hidden),
                (f"{self.name} o", self.hidden, q),
                (f"{self.name} gate_up", 2 * self.intermediate, self.hidden),
                (f"{self.name} down", self.hidden, self.intermediate)]


#: The models of the decode set, with the dimensions of their published ``config.json``.
DECODE_MODELS: tuple[ModelDims, ...] = (
    ModelDims("Llama-3.2-1B", 2048, 8192, 32, 8, 64),
    ModelDims("Llama-3.2-3B", 3072, 8192, 24, 8, 128),
    ModelDims("Llama-3.1-8B", 4096, 14336, 32, 8, 128),
    ModelDims("Llama-3.1-70B", 8192, 28672, 64, 8, 128),
    ModelDims("Qwen2.5-0.5B", 896, 4864, 14, 2, 64),
    ModelDims("Qwen2.5-1.5B", 1536, 8960, 12, 2, 128),
    ModelDims("Qwen2.5-3B", 2048, 11008, 16, 2, 128),
    ModelDims("Qwen2.5-14B", 5120, 13824, 40, 8, 128),
    ModelDims("Qwen2.5-32B", 5120, 27648, 40, 8, 128),
    ModelDims("Gemma-2-9B", 3584, 14336, 16, 8, 256),
)
#: Tokens per GEMM in the decode set: 1, 2, 4, ..., 1024.
DECODE_MS: tuple[int, ...] = tuple(2 ** i for i in range(11))

#: The Llama-3 8B and 70B layers of the design set: (layer, N, K).
LLAMA_NK: tuple[tuple[str, int, int], ...] = (
    ("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 28672, 4096), ("8B down", 4096, 14336),
    ("70B qkv", 10240, 8192), ("70B o", 8192, 8192), ("70B gate_up", 57344, 8192), ("70B down", 8192, 28672))
DESIGN_MS: tuple[int, ...] = (1, 16, 64, 128, 512, 2048, 4096, 8192)
DESIGN_EXTRA: tuple[Shape, ...] = (Shape("square", 8192, 8192, 8192), Shape("extra", 8192, 8192, 4096),
                                   Shape("extra", 1024, 4096, 2048), Shape("extra", 6144, 6144, 1280))
#: M from which a shape counts as large (the judged set).
LARGE_M = 2048

FIVE: tuple[Shape, ...] = (Shape("square", 8192, 8192, 8192), Shape("8B gate_up", 4096, 28672, 4096),
                           Shape("8B qkv", 2048, 6144, 4096), Shape("70B down", 8192, 8192, 28672),
                           Shape("70B qkv", 4096, 10240, 8192))
QUICK: tuple[Shape, ...] = (Shape("70B o", 8192, 8192, 8192), Shape("8B gate_up", 4096, 28672, 4096),
                            Shape("8B qkv", 2048, 6144, 4096), Shape("70B down", 4096, 8192, 28672),
                            Shape("8B o", 128, 4096, 4096), Shape("8B o", 16, 4096, 4096),
                            Shape("8B o", 1, 4096, 4096), Shape("70B o", 64, 8192, 8192))
#: Models and M of the decode set's quick variant (a small, a mid-size and a large model).
DECODE_QUICK_MODELS = ("Qwen2.5-0.5B", "Llama-3.1-8B", "Llama-3.1-70B")
DECODE_QUICK_MS = (1, 16, 64, 256)


def design_set() -> list[Shape]:
    """The 68 shapes of docs/design.md section 7, M-major within each layer."""
    out = [Shape(layer, m, n, k) for (layer, n, k) in LLAMA_NK for m in DESIGN_MS]
    return out + list(DESIGN_EXTRA)


def judged_set() -> list[Shape]:
    """The 27 shapes of :func:`design_set` with M >= :data:`LARGE_M`."""
    return [s for s in design_set() if s.m >= LARGE_M]


def decode_set(ms: tuple[int, ...] = DECODE_MS, models: tuple[str, ...] | None = None) -> list[Shape]:
    """Every linear layer of :data:`DECODE_MODELS` (or of the named ``models``) at every M of ``ms``;
    a weight shape shared by two models is kept once (the first model's name)."""
    known = {d.name for d in DECODE_MODELS}
    if models is not None:
        unknown = [m for m in models if m not in known]
        if unknown:
            raise ValueError(f"models: unknown {unknown}; expected names from {sorted(known)}")
    seen: set[tuple[int, int]] = set()
    nks = []
    for dims in DECODE_MODELS:
        if models is not None and dims.name not in models:
            continue
        for layer, n, k in dims.linear_nk():
            if (n, k) not in seen:
                seen.add((n, k))
                nks.append((layer, n, k))
    return [Shape(layer, m, n, k) for (layer, n, k) in nks for m in ms]


def small_m_set(ms: tuple[int, ...]) -> list[Shape]:
    """The eight Llama-3 8B / 70B layers at each M of ``ms`` (the split-K benchmark's set)."""
    return [Shape(layer, m, n, k) for (layer, n, k) in LLAMA_NK for m in ms]


def named_set(name: str, quick: bool = False) -> list[Shape]:
    """The set called ``name`` (``design``, ``judged``, ``five``, ``decode``, ``quick``); ``quick``
    shrinks ``decode`` to :data:`DECODE_QUICK_MODELS` x :data:`DECODE_QUICK_MS` and ``design`` /
    ``judged`` to :data:`QUICK`'s shapes of that regime."""
    if name == "decode":
        return decode_set(DECODE_QUICK_MS, DECODE_QUICK_MODELS) if quick else decode_set()
    if name == "design":
        return list(QUICK) if quick else design_set()
    if name == "judged":
        return [s for s in QUICK if s.m >= LARGE_M] if quick else judged_set()
    if name == "five":
        return list(FIVE[:2]) if quick else list(FIVE)
    if name == "quick":
        return list(QUICK)
    raise ValueError(f"shape set: unknown {name!r}; expected one of {SET_NAMES}")


SET_NAMES = ("design", "judged", "five", "decode", "quick")


def parse_shapes(text: str) -> list[Shape]:
    """``"6144x6144x1280,8192x4096x4096"`` -> two :class:`Shape` (layer ``"MxNxK"``); ``ValueError``
    on anything but three positive integers joined by ``x`` per comma-separated item."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--shapes: {item!r} is not MxNxK with positive integers")
        m, n, k = (int(p) for p in parts)
        shapes.append(Shape(f"{m}x{n}x{k}", m, n, k))
    return shapes


def parse_ints(text: str, what: str) -> list[int]:
    """``"1,16, 64"`` -> ``[1, 16, 64]``; an empty string gives ``[]``; ``ValueError`` naming ``what``
    on anything that is not a non-negative integer."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"{what}: expected comma-separated non-negative integers, got {item!r}")
        out.append(int(item))
    return out


def gemm_bytes(m: int, n: int, k: int, in_bytes: int = 1, out_bytes: int = 2) -> int:
    """The bytes a GEMM must move at least: both operands once and the output once."""
    return (m * k + n * k) * in_bytes + m * n * out_bytes

