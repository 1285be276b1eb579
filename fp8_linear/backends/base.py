"""The backend interface (docs/design.md section 4).

A backend does two jobs.

GEMM (``fp8_gemm``): ``supports(device) -> (ok, reason)``, ``can_run(problem) -> (ok, reason)`` and
``run(problem)`` on a validated :class:`GemmProblem`; the dispatcher takes the first backend that
says yes to both.

Linear layer (``FP8Linear``, the pattern of vLLM's ``ScaledMMLinearKernel``):
``can_implement(layer, device) -> (ok, reason)`` on the layer's :class:`LinearSpec`,
``process_weights(layer) -> LayerPlan`` once when the layer's tensors are set or moved, and
``apply(layer, x)`` per call: activation quantization + GEMM + bias, through the custom ops of
:mod:`fp8_linear.ops` so that ``torch.compile`` traces it whole.

Scale kinds, one vocabulary with :class:`~fp8_linear.QuantScheme` and ``quantize_fp8``
(docs/design.md section 2): activations (``scale_a``) ``tensor`` ``[1]``, ``token`` ``[M, 1]``,
``group`` ``[M, ceil(K/128)]``; weights (``scale_b``) ``tensor`` ``[1]``, ``channel`` ``[N, 1]``,
``block`` ``[ceil(N/128), ceil(K/128)]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..formats import FP8_DTYPES, GROUP_SIZE

SCALE_TENSOR = "tensor"  # [1], either operand
SCALE_TOKEN = "token"  # scale_a [M, 1]
SCALE_CHANNEL = "channel"  # scale_b [N, 1]
SCALE_GROUP = "group"  # scale_a [M, ceil(K/128)] (1x128 groups)
SCALE_BLOCK = "block"  # scale_b [ceil(N/128), ceil(K/128)] (128x128 blocks)
#: Per-row kinds of either side: ``token`` rows of A, ``channel`` rows of B.
ROW_KINDS = (SCALE_TOKEN, SCALE_CHANNEL)
#: Older name of the per-row kinds, accepted by :class:`GemmProblem` and read as token / channel.
SCALE_ROW = "row"
#: Activation modes of the fused quantization (the values of fp8_linear/kernels/quant_triton.py MODE_*).
MODE_STATIC, MODE_TOKEN, MODE_GROUP = 0, 1, 2
#: A dynamic per-tensor activation scale (AutoFP8 ``dynamic`` checkpoints): no fused kernel mode; the
#: scale is computed by torch ops (one amax reduction), then the GEMM runs.
MODE_DYNAMIC_TENSOR = 3
ACT_MODES = {SCALE_TENSOR: MODE_STATIC, SCALE_TOKEN: MODE_TOKEN, SCALE_GROUP: MODE_GROUP}


@dataclass(frozen=True)
class GemmProblem:
    """A validated FP8 GEMM: ``out[m, n] = sum_k a[m, k] * b[n, k] * sa * sb + bias[n]``.

    a: ``[M, K]`` float8_e4m3fn / float8_e5m2, K-contiguous.
    b: ``[N, K]`` float8_e4m3fn / float8_e5m2, K-contiguous (the nn.Linear weight layout).
    scale_a: fp32, ``[1]``, ``[M, 1]`` or ``[M, ceil(K/128)]``; kind ``tensor`` / ``token`` / ``group``.
    scale_b: fp32, ``[1]``, ``[N, 1]`` or ``[ceil(N/128), ceil(K/128)]``; kind ``tensor`` / ``channel`` / ``block``.
    bias: ``None`` or ``[N]`` (any float dtype; added in fp32).
    out_dtype: torch.bfloat16, torch.float16 or torch.float32.
    """

    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    bias: torch.Tensor | None
    out_dtype: torch.dtype
    scale_a_kind: str
    scale_b_kind: str

    def __post_init__(self):
        if self.scale_a_kind == SCALE_ROW:
            object.__setattr__(self, "scale_a_kind", SCALE_TOKEN)
        if self.scale_b_kind == SCALE_ROW:
            object.__setattr__(self, "scale_b_kind", SCALE_CHANNEL)

    @property
    def m(self) -> int:
        return self.a.shape[0]

    @property
    def n(self) -> int:
        return self.b.shape[0]

    @property
    def k(self) -> int:
        return self.a.shape[1]

    @property
    def device(self) -> torch.device:
        return self.a.device


def scale_kinds(scale_a: torch.Tensor, scale_b: torch.Tensor, m: int, n: int) -> tuple[str, str]:
    """The kinds of two already-validated scales of an ``M x N`` GEMM, read off their shapes."""
    ka = SCALE_TENSOR if scale_a.numel() == 1 else (SCALE_TOKEN if scale_a.shape[-1] == 1 else SCALE_GROUP)
    if scale_b.numel() == 1:
        kb = SCALE_TENSOR
    else:
        kb = SCALE_CHANNEL if scale_b.shape[0] == n and scale_b.shape[-1] == 1 else SCALE_BLOCK
    return ka, kb


@dataclass(frozen=True)
class LinearSpec:
    """What a backend needs to know of an ``FP8Linear`` to serve it, read off its tensors.

    n, k: ``out_features``, ``in_features``; weight_dtype: the FP8 dtype;
    weight_kind: ``tensor`` / ``channel`` / ``block``; activation_kind: ``tensor``, ``token`` or
    ``group``; activation_dynamic: False for a static ``input_scale`` (always ``tensor``), True for
    scales computed per call (``token``, ``group``, or a dynamic per-tensor scale); bias_dtype: ``None``
    without bias; device: the weight's device; mode: the activation quantization mode.
    """

    n: int
    k: int
    weight_dtype: torch.dtype
    weight_kind: str
    activation_kind: str
    bias_dtype: torch.dtype | None
    device: torch.device
    activation_dynamic: bool = False
    #: The activation quantization mode (:data:`MODE_STATIC` / :data:`MODE_TOKEN` / :data:`MODE_GROUP` /
    #: :data:`MODE_DYNAMIC_TENSOR`).
    mode: int = MODE_STATIC

    @classmethod
    def of(cls, layer) -> "LinearSpec":
        p = layer._parameters
        w, ws, bias = p["weight"], p["weight_scale"], p.get("bias")
        n, k = w.shape
        if ws.numel() == 1:
            wk = SCALE_TENSOR
        elif tuple(ws.shape) == (n, 1):
            wk = SCALE_CHANNEL
        else:
            wk = SCALE_BLOCK
        dynamic = p.get("input_scale") is None
        ak = layer.scheme.activation_granularity if dynamic else SCALE_TENSOR
        mode = MODE_DYNAMIC_TENSOR if dynamic and ak == SCALE_TENSOR else ACT_MODES[ak]
        return cls(n, k, w.dtype, wk, ak, None if bias is None else bias.dtype, w.device, dynamic, mode)


@dataclass(frozen=True)
class SharedPlan:
    """What a compiled call needs of a :class:`LayerPlan`, one object for every layer of one
    ``(backend, spec, generation)``: ``slot`` (the backend's key in :data:`BACKEND_SLOTS`), ``spec``
    and ``generation``. Kept in :data:`SHARED_PLANS` under the plan's ``key``.

    A traced ``FP8Linear`` call reads its plan's ``key`` (one integer guard a layer) and then this
    object and the backend through those module-level dicts: every layer of one spec reaches them by
    one source, so dynamo guards their fields once per spec and checks no aliasing per layer
    (docs/serving-investigations.md, "Locating the batch-64 idle")."""

    slot: int
    spec: LinearSpec
    generation: int


#: ``SharedPlan`` by key (small, never shrinks: one entry per distinct backend, spec and settings generation).
SHARED_PLANS: dict[int, SharedPlan] = {}
#: The backends of the shared plans, by slot.
BACKEND_SLOTS: dict[int, "Backend"] = {}
_shared_keys: dict[tuple, int] = {}
_slots: dict[int, int] = {}  # id(backend) -> slot (the backend is kept in BACKEND_SLOTS: its id stays its own)


def shared_plan_key(backend: "Backend", spec: LinearSpec, generation: int) -> int:
    """The key of the :class:`SharedPlan` of ``(backend, spec, generation)`` in :data:`SHARED_PLANS`
    (made on first use)."""
    # No lock (a re-plan may run inside a torch.compile trace, where a lock is a graph break): each dict
    # operation below is atomic under the GIL, and two threads making the same entry at once both end up
    # with the one that ``setdefault`` kept (the other's key maps to an equal object, unused).
    slot = _slots.get(id(backend))
    if slot is None:
        slot = _new_key(BACKEND_SLOTS, backend)
        slot = _slots.setdefault(id(backend), slot)
    ident = (slot, spec, generation)
    key = _shared_keys.get(ident)
    if key is None:
        key = _shared_keys.setdefault(ident, _new_key(SHARED_PLANS, SharedPlan(slot, spec, generation)))
    return key


def _new_key(table: dict, value) -> int:
    """A new integer key of ``table`` holding ``value`` (the smallest free one at the time)."""
    # Not fusion.py's ``itertools.count`` of group keys (these tables never shrink, so one would give the same
    # keys): a re-plan runs this inside a ``fullgraph`` trace (tests/integrations/test_compiled_replan.py),
    # where dict ``len`` / ``setdefault`` are plain traced dict operations, while ``next`` of a module-level
    # count needs dynamo's count-iterator support and its guard (traced on torch 2.13, CPU, 2026-12-02; torch
    # 2.11, served on the H200, not checked). Fusion keys, taken eagerly, must never be given twice (its
    # entries go), which a smallest free key would not ensure.
    key = len(table)
    while table.setdefault(key, value) is not value:
        key += 1
    return key


@dataclass(frozen=True)
class LayerPlan:
    """A layer's backend, chosen once (``FP8Linear`` keeps it as a plain attribute).

    backend: the :class:`Backend` whose ``apply`` runs the layer; spec: the layer's :class:`LinearSpec`;
    weight: the weight parameter the plan was made for (a replaced parameter makes a new plan);
    generation: ``fp8_linear.settings.GENERATION`` at the choice; reason: why this backend
    (and why the ones before it could not), as logged; key: the :class:`SharedPlan` of backend, spec
    and generation in :data:`SHARED_PLANS` (set on construction).
    """

    backend: "Backend"
    spec: LinearSpec
    weight: torch.Tensor
    generation: int
    reason: str
    key: int = field(init=False, default=-1)

    def __post_init__(self):
        object.__setattr__(self, "key", shared_plan_key(self.backend, self.spec, self.generation))


def expand_scale_a_to_groups(scale_a: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """A per-tensor ``[1]`` or per-token ``[M, 1]`` activation scale as 1x128 groups ``[M, ceil(K/128)]``:
    the same values, for GEMMs that pair group activations with block weights. M-major (strides
    ``(1, ld)``, ``ld = round_up(M, 4)``), the layout the sm90 kernel reads without a copy."""
    kbn, ld = -(-k // GROUP_SIZE), -(-m // 4) * 4
    buf = scale_a.new_empty((kbn, ld))
    buf[:, :m] = scale_a.reshape(1, -1)
    return buf[:, :m].t()


class Backend:
    """One way to run FP8 GEMMs and ``FP8Linear`` layers. Subclasses set ``name`` and implement the methods."""

    name: str = "?"

    # ------------------------------------------------------------------ GEMM
    def supports(self, device: torch.device) -> tuple[bool, str]:
        """Whether this backend can run at all on ``device`` (hardware, build), with the reason."""
        raise NotImplementedError

    def can_run(self, problem: GemmProblem) -> tuple[bool, str]:
        """Whether this backend can run ``problem`` (shapes, dtypes, scale kinds), with the reason."""
        raise NotImplementedError

    def run(self, problem: GemmProblem) -> torch.Tensor:
        """Compute ``problem``; returns a new ``[M, N]`` tensor of ``problem.out_dtype``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ linear layer
    def can_serve(self, spec: LinearSpec) -> tuple[bool, str]:
        """Whether this backend can run a layer of ``spec`` (its device is already supported)."""
        raise NotImplementedError

    def can_implement(self, layer, device: torch.device | None = None) -> tuple[bool, str]:
        """Whether this backend can run ``layer`` (an ``FP8Linear``) on ``device`` (default: its weight's)."""
        spec = LinearSpec.of(layer)
        device = spec.device if device is None else torch.device(device)
        ok, why = self.supports(device)
        if not ok:
            return ok, why
        if device != spec.device:
            return False, f"the layer's weight is on {spec.device}, not {device}"
        if spec.weight_dtype not in FP8_DTYPES:
            return False, f"weight dtype {spec.weight_dtype} is not FP8"
        return self.can_serve(spec)

    def process_weights(self, layer) -> None:
        """Prepare ``layer``'s tensors for :meth:`apply`, once per plan: contiguous weight, fp32
        contiguous scales, contiguous bias (parameters replaced only where they are not already so)."""
        p = layer._parameters
        for name, want in (("weight", None), ("weight_scale", torch.float32), ("input_scale", torch.float32),
                           ("bias", None)):
            t = p.get(name)
            if t is None or t.device.type == "meta":
                continue
            if not t.is_contiguous() or (want is not None and t.dtype != want):
                p[name] = torch.nn.Parameter(t.detach().to(want or t.dtype).contiguous(), requires_grad=False)

    def apply(self, layer, x: torch.Tensor, spec: LinearSpec | None = None) -> torch.Tensor:
        """``layer(x)``: ``x`` ``[..., K]`` (bf16/fp16/fp32, validated by ``FP8Linear.forward``) ->
        ``[..., N]`` in ``x``'s dtype. ``spec``: the layer's :class:`LinearSpec` (default: its plan's;
        a compiled call passes its :class:`SharedPlan`'s, so that nothing of the layer's plan is read)."""
        raise NotImplementedError

    #: The GEMM op on an activation already quantized (``gemm(q, weight, scale_a, weight_scale, bias,
    #: out_dtype)``, as :func:`quantize_and_gemm` calls it), or ``None`` where the backend has none; a fused
    #: group (``fp8_linear.fusion``) runs its members' GEMMs on one quantized input through it.
    gemm_op = None


def quantize_activation(layer, x2: torch.Tensor, spec: LinearSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale_a)`` of the flattened activation ``x2`` ``[M, K]`` as ``spec`` says: the static
    ``input_scale`` ``[1]``, or dynamic per ``tensor`` / ``token`` / 1x128 ``group`` scales (custom ops)."""
    from .. import ops

    if not spec.activation_dynamic:
        s = layer._parameters["input_scale"]
        return ops.quantize_static(x2, s, spec.weight_dtype), s
    return ops.quantize_dynamic(x2, spec.weight_dtype, spec.activation_kind)


def quantize_and_gemm(layer, x: torch.Tensor, gemm, spec: LinearSpec | None = None) -> torch.Tensor:
    """``layer(x)`` as activation quantization (:func:`quantize_activation`) then ``gemm(q, weight,
    scale_a, weight_scale, bias, out_dtype)`` (a GEMM op of :mod:`fp8_linear.ops`); ``[..., K] -> [..., N]``.
    ``spec``: the layer's :class:`LinearSpec` (default: its plan's)."""
    if spec is None:
        spec = layer._plan.spec
    x2 = x.reshape(-1, spec.k)
    if x2.shape[0] == 0:
        return empty_linear_output(layer, x)
    q, sa = quantize_activation(layer, x2, spec)
    p = layer._parameters
    out = gemm(q, p["weight"], sa, p["weight_scale"], p.get("bias"), x.dtype)
    return out.reshape(*x.shape[:-1], spec.n)


def empty_linear_output(layer, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for an ``x`` with no rows (``[..., 0, K]``): the bias broadcast, or nothing."""
    out = x.new_zeros((*x.shape[:-1], layer.out_features))
    bias = layer._parameters.get("bias")
    return out if bias is None else out + bias.to(x.dtype)
