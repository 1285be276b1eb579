"""``FP8Experts``: transformers' fused experts modules with FP8 3-D weights (docs/moe.md).

An FP8 experts module is an instance of ``FP8<Original>``, a subclass of both :class:`FP8Experts`
and the original experts class (``FP8Qwen3MoeExperts(FP8Experts, Qwen3MoeExperts)``), so the model's
own routing code calls it unchanged and model-specific parts (``_apply_gate`` of gpt-oss, the
activation, a post-expert norm) are inherited. Its ``forward`` runs the experts implementation
registered as ``"fp8_linear"`` in transformers' ``ALL_EXPERTS_FUNCTIONS`` (:func:`fp8_experts_forward`:
sort the routed tokens by expert, one grouped FP8 GEMM per projection, gate, weighted sum).

Tensors (``E`` experts, hidden ``H``, intermediate ``I``; the first projection is ``gate_up_proj``
with ``P = 2`` parts [gate; up] or ``up_proj`` with ``P = 1``; ``N`` its rows, ``2I`` or ``I``):

=============================== ============================== ============================================
name                            dtype / shape                  meaning
=============================== ============================== ============================================
``gate_up_proj`` / ``up_proj``  FP8 ``[E, N, H]``              weights in the nn.Linear layout (out, in)
``down_proj``                   FP8 ``[E, H, I]``
``<proj>_scale``                fp32, by weight granularity:   ``W[e] ~= q[e] * scale[e]`` per part:
                                tensor ``[E, P]``,             one scale per expert and part,
                                channel ``[E, rows, 1]``,      one per output row,
                                block ``[E, P, ceil(rows/P/128), ceil(in/128)]``  128x128 blocks per part
``<proj>_input_scale``          fp32 ``[E]`` (static only)     per-expert activation scale
``<proj>_bias``                 float ``[E, rows]``            when the original has biases
=============================== ============================== ============================================

(``down_proj`` has ``P = 1``.) Parts keep gate and up apart, as the per-expert checkpoints of
vLLM / llm-compressor store them (``experts.{e}.gate_proj`` / ``up_proj``), so saving and loading is
exact. Interleaved gate/up rows (``is_concatenated=False``, gpt-oss) take per-tensor and per-channel
scales; 128x128 blocks need the concatenated layout.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from ..errors import ScaleError, ShapeError
from ..formats import FP8_DTYPES, GROUP_SIZE, SCALE_DTYPE, format_name, resolve_format, scale_from_amax
from ..grouped_gemm import grouped_fp8_gemm_unchecked
from ..ops import quantize_dynamic
from ..quantize import quantize_fp8, quantize_unchecked, validate_scale
from ..scheme import QuantScheme, resolve_scheme
from . import hf
from .hf import implementation
from .sm90_grouped import quantize_groups

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Projection name -> the original module's bias attribute.
_BIAS = {"gate_up_proj": "gate_up_proj_bias", "up_proj": "up_proj_bias", "down_proj": "down_proj_bias"}

_classes: dict[type, type] = {}


#: Methods of the original class the FP8 forward calls (the model's own gate), bound in the FP8 subclass itself.
_INHERITED_CALLS = ("_apply_gate",)


def fp8_experts_class(original: type) -> type:
    """The FP8 subclass ``FP8<Name>(FP8Experts, original)`` of a fused experts class (cached).

    The original's ``_apply_gate`` (the method the forward calls, :data:`_INHERITED_CALLS`) is bound in the
    subclass's own dict, the same object the MRO would find: traced, dynamo then finds it on the instance's
    class and guards nothing more, where a lookup past the class adds a guard per layer that
    :class:`FP8Experts` still lacks it (``type(experts).__mro__[1].__dict__``) (docs/moe.md, "Compiled
    decode guards")."""
    if issubclass(original, FP8Experts):
        return original
    if original not in _classes:
        name = f"FP8{original.__name__}"
        ns = {"__module__": __name__, "__qualname__": name}
        for attr in _INHERITED_CALLS:
            found = inspect.getattr_static(original, attr, None)  # the raw class attribute (a function)
            if found is not None and attr not in FP8Experts.__dict__:
                ns[attr] = found
        _classes[original] = type(name, (FP8Experts, original), ns)
    return _classes[original]


def _layout(src: nn.Module) -> dict:
    """Flags and sizes of a fused experts module (``use_experts_implementation``'s attributes)."""
    has_gate = bool(getattr(src, "has_gate", True))
    first = "gate_up_proj" if has_gate else "up_proj"
    transposed = bool(getattr(src, "is_transposed", False))
    for nm in (first, "down_proj"):
        t = getattr(src, nm, None)
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ShapeError(f"{type(src).__name__}.{nm}: expected a 3-D expert weight, got "
                             f"{None if t is None else list(t.shape)}")
    w1, w2 = getattr(src, first), src.down_proj
    e, n1, h = (w1.shape[0], w1.shape[2], w1.shape[1]) if transposed else tuple(w1.shape)
    _, h2, i = (w2.shape[0], w2.shape[2], w2.shape[1]) if transposed else tuple(w2.shape)
    parts = 2 if has_gate else 1
    if h2 != h or n1 != parts * i or w2.shape[0] != e:
        raise ShapeError(f"{type(src).__name__}: {first} {list(w1.shape)} and down_proj {list(w2.shape)} do not "
                         f"describe {e} experts of hidden {h} and intermediate {n1 // parts}")
    return dict(has_gate=has_gate, first=first, transposed=transposed, num_experts=e, hidden=h, inter=i, parts=parts,
                concatenated=bool(getattr(src, "is_concatenated", True)), has_bias=bool(getattr(src, "has_bias", False)))


def weight_scale_shape(granularity: str, experts: int, rows: int, cols: int, parts: int) -> tuple[int, ...]:
    """Shape of a stored expert weight scale (see the module table)."""
    if granularity == "tensor":
        return (experts, parts)
    if granularity == "channel":
        return (experts, rows, 1)
    if granularity == "block":
        return (experts, parts, math.ceil(rows // parts / GROUP_SIZE), math.ceil(cols / GROUP_SIZE))
    raise ValueError(f"granularity: expected tensor, channel or block, got {granularity!r}")


def part_rows(w: torch.Tensor, p: int, parts: int, concatenated: bool) -> torch.Tensor:
    """Rows of part ``p`` (0 = gate, 1 = up) of a fused ``[..., N, K]`` weight: a view."""
    if parts == 1:
        return w
    n = w.shape[-2] // parts
    return w[..., p * n:(p + 1) * n, :] if concatenated else w[..., p::parts, :]


class FP8Experts(nn.Module):
    """Fused MoE experts with FP8 weights; see the module docstring for tensors and layouts.

    Not built directly: :meth:`from_experts` quantizes an original experts module, :meth:`empty_like`
    builds one to load a checkpoint into. ``forward(hidden_states [T, H], top_k_index [T, k],
    top_k_weights [T, k]) -> [T, H]`` in ``hidden_states``' dtype, as the original.
    """

    # ------------------------------------------------------------------ construction
    @classmethod
    def empty_like(cls, src: nn.Module, scheme: "str | QuantScheme", device=None) -> "FP8Experts":
        """An FP8 twin of the experts module ``src`` with placeholder tensors (zeros / ones) on ``device``
        (default: ``src``'s device; ``"meta"`` for loading). Everything but the expert weights (activation,
        post-expert norm, config, flags, other parameters) is shared with ``src``."""
        scheme = resolve_scheme(scheme)
        lay = _layout(src)
        if scheme.weight_granularity == "block" and lay["parts"] == 2 and not lay["concatenated"]:
            raise ValueError(f"scheme: 128x128 weight blocks need concatenated gate/up rows; {type(src).__name__} "
                             f"interleaves them (use a per-tensor or per-channel scheme)")
        klass = fp8_experts_class(type(src))
        obj = klass.__new__(klass)
        nn.Module.__init__(obj)
        skip = set(obj.__dict__)  # nn.Module's own state (parameters, hooks, ...) is not shared
        obj.__dict__.update({k: v for k, v in src.__dict__.items() if k not in skip})
        obj.training = src.training
        for k, m in src._modules.items():
            obj._modules[k] = m
        for k, b in src._buffers.items():
            obj.register_buffer(k, b, persistent=k not in src._non_persistent_buffers_set)
        weights = {lay["first"], "down_proj"}
        for k, p in src._parameters.items():
            if k not in weights and k not in _BIAS.values():
                obj._parameters[k] = p
        dev = torch.device(device) if device is not None else getattr(src, lay["first"]).device
        obj._init_tensors(scheme, lay, dev, src)
        return obj

    def _init_tensors(self, scheme: QuantScheme, lay: dict, device, src: nn.Module) -> None:
        self.scheme = scheme
        self.weight_granularity = scheme.weight_granularity
        self.activation_granularity = scheme.activation_granularity
        self.fp8_layout = lay
        self.is_transposed = False  # our FP8 weights are [E, out, in] whatever the original stored
        self.num_experts = lay["num_experts"]
        # What the forward reads, each a plain bool or string attribute (one C++ equality guard per layer under
        # torch.compile; sizes come from the weights' static shapes): not ``scheme`` (all layers share one
        # QuantScheme, and dynamo checks that sharing in Python on every call), not the ``fp8_layout`` dict
        # (a guard per key read), no attribute looked up with a default (a guard per module dict searched).
        self.activation_mode = "static" if scheme.static else scheme.activation_granularity
        self.has_gate = lay["has_gate"]
        self.first_projection = lay["first"]
        self.is_concatenated = lay["concatenated"]
        self.has_post_expert_norm = bool(getattr(src, "has_post_expert_norm", False))
        fp8 = resolve_format(scheme.fmt)
        e = lay["num_experts"]
        kw = dict(device=device)
        for name, rows, cols, p in self.projections():
            self.register_parameter(name, nn.Parameter(torch.zeros(e, rows, cols, dtype=fp8, **kw), requires_grad=False))
            shape = weight_scale_shape(scheme.weight_granularity, e, rows, cols, p)
            self.register_parameter(f"{name}_scale", nn.Parameter(torch.ones(shape, dtype=SCALE_DTYPE, **kw), requires_grad=False))
            if scheme.static:
                self.register_parameter(f"{name}_input_scale",
                                        nn.Parameter(torch.ones(e, dtype=SCALE_DTYPE, **kw), requires_grad=False))
            else:
                self.register_parameter(f"{name}_input_scale", None)
            bias = getattr(src, _BIAS[name], None) if lay["has_bias"] else None
            if isinstance(bias, torch.Tensor):
                self.register_parameter(_BIAS[name], nn.Parameter(
                    torch.zeros(e, rows, dtype=bias.dtype, **kw), requires_grad=False))
        self.fp8_bias = any(_BIAS[name] in self._parameters for name, *_ in self.projections())

    def projections(self) -> list[tuple[str, int, int, int]]:
        """``(name, rows, cols, parts)`` of the two projections, first then ``down_proj``."""
        lay = self.fp8_layout
        return [(lay["first"], lay["parts"] * lay["inter"], lay["hidden"], lay["parts"]),
                ("down_proj", lay["hidden"], lay["inter"], 1)]

    @classmethod
    def from_experts(
        cls,
        src: nn.Module,
        scheme: "str | QuantScheme" = "fp8-channel",
        input_amax: "dict[str, torch.Tensor] | None" = None,
        weight_scales: "dict[str, torch.Tensor] | None" = None,
    ) -> "FP8Experts":
        """Quantize a fused experts module (a class marked ``use_experts_implementation``).

        Args:
            src: the original module (weights ``[E, N, K]``, or ``[E, K, N]`` when ``is_transposed``).
            scheme: preset name or :class:`QuantScheme`; weight granularity per expert and part.
            input_amax: static schemes: ``{proj: [E]}`` calibrated amax of each expert's input, for
                ``gate_up_proj`` (or ``up_proj``) and ``down_proj``; finite and non-negative.
            weight_scales: optional precomputed ``{proj: scale}`` of the stored scale shapes (e.g. from an
                MSE observer); default min-max (``amax / fmt_max`` per expert, part and cell).
        """
        if not hf.is_fused_experts(src) and not isinstance(src, FP8Experts):
            raise TypeError(f"src: expected a fused experts module (a class decorated with use_experts_implementation), "
                            f"got {type(src).__name__}")
        if isinstance(src, FP8Experts):
            raise TypeError(f"src: {type(src).__name__} is already FP8")
        scheme = resolve_scheme(scheme)
        obj = cls.empty_like(src, scheme)
        fp8 = resolve_format(scheme.fmt)
        lay = obj.fp8_layout
        for name, rows, cols, parts in obj.projections():
            w = getattr(src, name).detach()
            w = w.transpose(-2, -1) if lay["transposed"] else w
            if not bool(torch.isfinite(w).all()):
                raise ValueError(f"src.{name}: expected finite values, got NaN/inf in a {list(w.shape)} expert weight")
            given = None if weight_scales is None else weight_scales.get(name)
            q, s = quantize_expert_weight(w, scheme.weight_granularity, fp8, parts, lay["concatenated"], given, name)
            getattr(obj, name).data.copy_(q)
            getattr(obj, f"{name}_scale").data.copy_(s)
            if _BIAS[name] in obj._parameters:
                getattr(obj, _BIAS[name]).data.copy_(getattr(src, _BIAS[name]).detach())
            if scheme.static:
                amax = None if input_amax is None else input_amax.get(name)
                if amax is None:
                    raise ValueError(f"input_amax: scheme {scheme.name!r} has static activations and needs a calibrated "
                                     f"[{lay['num_experts']}] amax for {name}, got None")
                amax = torch.as_tensor(amax, dtype=SCALE_DTYPE).reshape(-1).cpu()
                if amax.numel() != lay["num_experts"] or not bool(torch.isfinite(amax).all()) or bool((amax < 0).any()):
                    raise ScaleError(f"input_amax[{name!r}]: expected {lay['num_experts']} finite non-negative values, "
                                     f"got {amax.tolist()}")
                getattr(obj, f"{name}_input_scale").data.copy_(scale_from_amax(amax, fp8))
        return obj

    # ------------------------------------------------------------------ forward
    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        return implementation()(self, hidden_states, top_k_index, top_k_weights)  # a name, not hf.<name>: no alias guard

    def gemm(self, name: str, x: torch.Tensor, sorted_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Projection ``name`` of the rows ``x`` ``[S, in]`` sorted by expert (``sorted_ids`` ``[S]``,
        ``offsets`` ``[E]``): activation quantization (static per expert, or dynamic) + grouped GEMM
        (+ bias). Returns ``[S, rows]`` in ``x``'s dtype (:func:`project`)."""
        return project(self, name, x, sorted_ids, offsets)

    # ------------------------------------------------------------------ housekeeping
    def check(self) -> None:
        """Validate the tensors (after a load): FP8 weights of the layout's shapes, finite positive scales."""
        e = self.num_experts
        for name, rows, cols, parts in self.projections():
            w = getattr(self, name)
            if w.dtype not in FP8_DTYPES:
                raise TypeError(f"{name}: expected an FP8 dtype, got {w.dtype}")
            if tuple(w.shape) != (e, rows, cols):
                raise ShapeError(f"{name}: expected shape [{e}, {rows}, {cols}], got {list(w.shape)}")
            validate_scale(getattr(self, f"{name}_scale"),
                           weight_scale_shape(self.scheme.weight_granularity, e, rows, cols, parts), f"{name}_scale")
            if getattr(self, f"{name}_input_scale") is not None:
                validate_scale(getattr(self, f"{name}_input_scale"), (e,), f"{name}_input_scale")

    def fp8_tensors(self) -> list[torch.Tensor]:
        """The FP8 weights and their fp32 scales (what quantization replaced the original weights with)."""
        out = []
        for name, *_ in self.projections():
            out += [t for t in (getattr(self, name), getattr(self, f"{name}_scale"), getattr(self, f"{name}_input_scale"))
                    if t is not None]
        return out

    def _apply(self, fn, recurse=True):
        keep = self.fp8_tensors()

        def keep_dtype(t):
            out = fn(t)
            if any(t is p for p in keep) and isinstance(out, torch.Tensor) and out.dtype != t.dtype:
                return t.to(device=out.device)
            return out

        return super()._apply(keep_dtype, recurse)

    def extra_repr(self) -> str:
        lay = self.fp8_layout
        return (f"num_experts={lay['num_experts']}, hidden={lay['hidden']}, intermediate={lay['inter']}, "
                f"scheme={self.scheme.name}, format={format_name(getattr(self, lay['first']).dtype)}, "
                f"weight_scale={self.scheme.weight_granularity}, activations="
                f"{'static per expert' if self.scheme.static else 'dynamic per-' + self.scheme.activation_granularity}")


def quantize_expert_weight(w: torch.Tensor, granularity: str, fp8: torch.dtype, parts: int = 1,
                           concatenated: bool = True, scale: torch.Tensor | None = None, name: str = "weight"):
    """Quantize a stacked expert weight ``w`` ``[E, N, K]`` (nn.Linear layout per expert) per expert and part.

    Returns ``(q, scale)``: ``q`` FP8 ``[E, N, K]``; ``scale`` fp32 of :func:`weight_scale_shape`.
    ``scale`` (optional, that shape) replaces the min-max scale.
    """
    e, n, k = w.shape
    shape = weight_scale_shape(granularity, e, n, k, parts)
    if scale is not None:
        scale = validate_scale(scale.to(w.device), shape, f"weight_scales[{name!r}]")
    wf = w.float()
    q = torch.empty(w.shape, dtype=fp8, device=w.device)
    out = torch.empty(shape, dtype=SCALE_DTYPE, device=w.device)
    if granularity == "channel":
        qq, ss = quantize_fp8(wf.reshape(e * n, k), fp8, "channel", None if scale is None else scale.reshape(e * n, 1))
        return qq.reshape(e, n, k), ss.reshape(shape)
    for x in range(e):
        for p in range(parts):
            rows = part_rows(wf[x], p, parts, concatenated)
            if granularity == "tensor":
                qq, ss = quantize_fp8(rows, fp8, "tensor", None if scale is None else scale[x, p].reshape(1))
                out[x, p] = ss.reshape(())
            else:
                qq, ss = quantize_fp8(rows, fp8, "block", None if scale is None else scale[x, p])
                out[x, p] = ss
            part_rows(q[x], p, parts, concatenated).copy_(qq)
    return q, out


def project(mod: FP8Experts, name: str, x: torch.Tensor, sorted_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """:meth:`FP8Experts.gemm` as a function: the forward calls it directly (no per-layer method lookup guard
    under torch.compile). It reads the module's ``activation_mode``, ``weight_granularity``, ``fp8_bias``
    (and ``is_concatenated`` for per-tensor scales of two parts) and the projection's tensors."""
    w = getattr(mod, name)
    fp8 = w.dtype
    mode = mod.activation_mode
    if mode == "static":
        rows_scale = getattr(mod, f"{name}_input_scale")[sorted_ids.clamp(max=w.shape[0] - 1)].unsqueeze(-1)
        q, sa = quantize_unchecked(x, fp8, rows_scale), rows_scale
    elif mode == "group":  # M-major scales from act_quant on sm90
        q, sa = quantize_groups(x, fp8)
    else:
        q, sa = quantize_dynamic(x, fp8, mode)  # an op under torch.compile
    bias = getattr(mod, _BIAS[name], None) if mod.fp8_bias else None
    s = getattr(mod, f"{name}_scale")
    parts = s.shape[1] if s.dim() != 3 else 1
    gran = mod.weight_granularity
    if gran == "channel":
        return grouped_fp8_gemm_unchecked(q, w, sa, s, offsets, bias, x.dtype)
    if gran == "tensor":
        if parts == 1:
            sb = s.reshape(-1)
        elif mod.is_concatenated:
            sb = s.repeat_interleave(w.shape[1] // parts, dim=1).unsqueeze(-1)
        else:
            sb = s.repeat(1, w.shape[1] // parts).unsqueeze(-1)
        return grouped_fp8_gemm_unchecked(q, w, sa, sb, offsets, bias, x.dtype)
    # 128x128 blocks (concatenated parts)
    rows = w.shape[1] // parts
    if parts == 1 or rows % GROUP_SIZE == 0:
        sb = s.reshape(s.shape[0], -1, s.shape[-1])
        return grouped_fp8_gemm_unchecked(q, w, sa, sb, offsets, bias, x.dtype)
    outs = [grouped_fp8_gemm_unchecked(q, part_rows(w, p, parts, True), sa, s[:, p], offsets,
                                       None if bias is None else bias[:, p * rows:(p + 1) * rows], x.dtype)
            for p in range(parts)]
    return torch.cat(outs, dim=-1)


def fp8_experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``"fp8_linear"`` experts implementation: ``[T, H]`` tokens, ``[T, k]`` expert ids and weights -> ``[T, H]``.

    Tokens are sorted by expert (a stable sort), each projection is one grouped FP8 GEMM over all
    experts (:func:`fp8_linear.grouped_fp8_gemm`), the gate is the class's own ``_apply_gate``, and
    the ``k`` weighted expert outputs of each token are summed in fp32 (deterministic, as
    transformers' ``grouped_mm`` implementation). Expert ids ``>= E`` (expert-parallel sentinels) add nothing.
    """
    if not isinstance(self, FP8Experts):
        raise TypeError(f"self: the fp8_linear experts implementation runs FP8Experts modules, got {type(self).__name__}")
    x = hidden_states
    if not isinstance(x, torch.Tensor) or x.dtype not in ACT_DTYPES:
        raise TypeError(f"hidden_states: expected a bfloat16/float16/float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    down = self.down_proj  # [E, H, I]: the sizes are the weights' static shapes (no attribute guards)
    e, hidden = down.shape[0], down.shape[1]
    if x.dim() != 2 or x.shape[-1] != hidden:
        raise ShapeError(f"hidden_states: expected shape [tokens, {hidden}], got {list(x.shape)}")
    if top_k_index.shape != top_k_weights.shape or top_k_index.dim() != 2 or top_k_index.shape[0] != x.shape[0]:
        raise ShapeError(f"top_k_index / top_k_weights: expected equal shapes [{x.shape[0]}, k], got "
                         f"{list(top_k_index.shape)} / {list(top_k_weights.shape)}")
    tokens, k = top_k_index.shape
    ids = top_k_index.reshape(-1)
    sorted_ids, perm = torch.sort(ids, stable=True)
    xs = x[perm // k]
    # histc has a static output size (CUDA graphs, torch.compile); ids >= E fall outside and count nowhere
    hist_in = sorted_ids.float() if x.device.type in ("cpu", "mps") else sorted_ids.int()
    counts = torch.histc(hist_in, bins=e, min=0, max=e - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    h = project(self, self.first_projection, xs, sorted_ids, offsets)
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
    y = project(self, "down_proj", h, sorted_ids, offsets)
    if self.has_post_expert_norm:
        y = self.post_expert_norm(y)
    y = y * top_k_weights.reshape(-1)[perm].unsqueeze(-1).to(y.dtype)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return y[inv].view(tokens, k, hidden).sum(dim=1).to(x.dtype)


try:
    hf.register_implementation(fp8_experts_forward)
except ImportError:  # transformers without the experts interface: there is nothing to convert either
    pass
