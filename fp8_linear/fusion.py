"""Fused sibling projections: one activation quantization and one GEMM for FP8 layers that read one input.

A Llama / Qwen / Gemma decoder layer calls ``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)`` and
``gate_proj(y)``, ``up_proj(y)`` one after the other on the same tensors. :func:`fuse_projections`
concatenates each such group's FP8 weights into one ``[N_1 + ... + N_g, K]`` buffer (the members'
weights become row views of it: no copy of the model is kept) and makes the group run as one
``FP8Linear`` the first time one of its members is called with an input; the other members slice that
output. transformers' model code is left as it is: the members stay ``FP8Linear`` modules with the
same names, parameters and state-dict keys (docs/serving.md, "Fused projections").

How a call goes. A group (:class:`SiblingGroup`, an ``nn.Module`` that no module tree holds: a
member keeps it in its ``__dict__`` as ``_fusion``, so no parameter list or state dict sees it) holds
the fused layer. While its parent module's forward runs (a pre-hook and an ``always_call`` hook on the
parent) the module-level :data:`_ROUNDS` holds the group's round: the input the fused output was
computed for (by that tensor's identity), the output and a bit per member already given its slice. The
first member called computes it and the other members take their column slices; the last one drops the
output, and the parent's hook removes the round, so nothing tensor-valued survives a forward (dynamo's
guards see the same Python state at every call: no recompiles). A member called with another tensor (a
cross-attention ``k_proj`` on the encoder states), twice with one tensor, or outside its parent's forward
(a user calling ``q_proj`` alone) runs its own GEMM on its own rows of the fused weight. A group whose
forward ended with members not served (its members do not read one tensor) stops fusing from then on
(:attr:`SiblingGroup.disabled_reason` says why; under ``torch.compile`` that is one recompile).

Under ``torch.compile`` everything a traced forward reads of a group is reached from the module tree:
the parent's ``_fusion_leads`` and the members' ``_fusion_slot`` (tuples of strings and ints), the group
(an ``nn.Module`` in the lead member's ``__dict__``: its ``enabled`` and the fused ``FP8Linear``), so that
with dynamo's recursive dict-tag guards a fused decoder layer is skipped while unchanged, as an unfused
one is; the rounds are one global dict (two guards for the whole model, empty again at the end of each
forward).
docs/serving-investigations.md, "Locating the batch-64 idle", has the guard counts.

Exactness: the fused layer quantizes the activation exactly as each member would (members must agree:
the same static ``input_scale`` value, or the same dynamic mode), and its weight scale gives every
output row the member's own factor: per-tensor member scales become one per-channel vector,
per-channel ones are concatenated, 128x128 block scales are concatenated when every member's N is a
multiple of 128. A group that does not meet these is not fused and the report says why. The fused GEMM
differs from the members' GEMMs only in the order a backend sums in FP32 (its tile and split-K choice
for the wider N).
"""

from __future__ import annotations

import itertools
import logging
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from . import settings
from .backends.base import SCALE_BLOCK, quantize_activation
from .errors import FP8LinearError
from .formats import GROUP_SIZE
from .module import ACT_DTYPES, FP8Linear

logger = logging.getLogger("fp8_linear")

#: Sibling projections that transformers' model code calls on one input, per parent module (child names).
DEFAULT_PATTERNS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),  # Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3-small, OLMo, Bart self-attention
    ("gate_proj", "up_proj"),  # the gated MLPs of the same families
    ("query", "key", "value"),  # BERT-style self-attention
    ("q", "k", "v"),  # T5 attention
    ("wi_0", "wi_1"),  # T5 gated feed-forward
)
#: In a parent whose name says cross-attention, only the key / value projections read one tensor (the
#: encoder's states); the query reads the decoder's.
CROSS_ATTENTION_HINTS = ("encoder_attn", "crossattention", "cross_attn", "cross_attention")
CROSS_ATTENTION_PATTERNS: tuple[tuple[str, ...], ...] = (("k_proj", "v_proj"), ("key", "value"), ("k", "v"))
#: Plain attribute of a parent module: its fused groups (a tuple).
_GROUPS_ATTR = "_fusion_groups"
#: Plain attribute of a parent module: ``(name of the first member, full)`` of each group (a tuple, in group
#: order; ``full``: a bit per member), what its hooks read under ``torch.compile`` (ints and strings: dict-tag safe).
_LEADS_ATTR = "_fusion_leads"
#: Every live group by its ``key`` (weak references: a registry entry keeps nothing alive); read eagerly
#: only (introspection, tests), never by a traced forward.
_GROUPS: dict[int, "weakref.ref[SiblingGroup]"] = {}
#: Keys of :data:`_GROUPS`, each given once. Not ``backends.base._new_key`` (the smallest free key of the
#: shared-plan tables, which never shrink): entries here go (a group's weak reference dies, ``detach``), and
#: a freed key given again would let a dead group's key (a ``_fusion_slot`` constant in compiled code) name
#: another group. Taken only eagerly (fusing, copying), never inside a trace.
_keys = itertools.count()
#: The open rounds, by group key: ``(input or None, fused output or None, bit per member served, bits of all
#: members)``; the "fused output" is ``(q, scale_a)``, the quantized input, where the group runs its members'
#: GEMMs apart (:func:`_split_plan`). A parent's pre-hook opens ``(None, None, 0, full)`` for each of its groups that fuses, its
#: closing hook removes them: between forwards the dict is empty. One global dict for every group of every
#: model: a compiled forward guards it twice (its type, that it is empty) and replays its mutations as one
#: ``clear`` / ``update`` (no attribute store), where a round kept on each group cost guards and a replayed
#: store per group. Eagerly each group has its own entry (forwards of other models on other threads do not
#: touch it); a compiled forward's replay clears the whole dict, so an eager forward on another thread at
#: that moment runs its members apart for that forward (the same values up to the order of FP32 sums).
_ROUNDS: dict[int, tuple] = {}
#: Rows of a 128x128 weight block (block scales concatenate only at multiples of it).
BLOCK_ROWS = GROUP_SIZE


class FusionError(FP8LinearError, ValueError):
    """A group of projections cannot be fused (or unfused) as asked; the message names the modules and why."""


@dataclass(frozen=True)
class FusedGroupInfo:
    """One fused group: ``parent`` (module name), ``members`` (child names, in row order), ``rows``
    (each member's output features), ``in_features``, ``weight_kind`` of the fused GEMM
    (``channel`` or ``block``)."""

    parent: str
    members: tuple[str, ...]
    rows: tuple[int, ...]
    in_features: int
    weight_kind: str


@dataclass(frozen=True)
class SkippedGroup:
    """A candidate group left unfused: ``parent``, ``members`` (child names) and the ``reason``."""

    parent: str
    members: tuple[str, ...]
    reason: str


@dataclass
class FusionReport:
    """What :func:`fuse_projections` did: ``fused`` groups and ``skipped`` candidates (with reasons)."""

    fused: list[FusedGroupInfo] = field(default_factory=list)
    skipped: list[SkippedGroup] = field(default_factory=list)

    @property
    def layers_removed(self) -> int:
        """FP8 GEMM calls a forward saves: members minus groups."""
        return sum(len(g.members) - 1 for g in self.fused)

    def __str__(self) -> str:
        lines = [f"fused {len(self.fused)} groups ({self.layers_removed} fewer FP8 GEMM calls a forward), "
                 f"skipped {len(self.skipped)}"]
        shapes: dict[tuple, int] = {}
        for g in self.fused:
            key = ("/".join(g.members), "+".join(map(str, g.rows)), g.in_features, g.weight_kind)
            shapes[key] = shapes.get(key, 0) + 1
        for (names, rows, k, kind), count in shapes.items():
            lines.append(f"  {count} x {names}: N = {rows}, K = {k}, {kind} weight scales")
        for s in self.skipped:
            lines.append(f"  skipped {s.parent}.{{{','.join(s.members)}}}: {s.reason}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------- exactness
def _weight_kind(layer: FP8Linear) -> str:
    ws = layer._parameters["weight_scale"]
    if ws.numel() == 1:
        return "tensor"
    if tuple(ws.shape) == (layer.out_features, 1):
        return "channel"
    return "block"


def fusion_refusal(layers: list[FP8Linear], _grouped: bool = False) -> str | None:
    """Why ``layers`` (``FP8Linear`` modules of one parent) cannot run as one exact GEMM, or ``None``.

    Exact means: the same input features, FP8 format, device and bias dtype; one activation
    quantization (the same static ``input_scale`` value bit for bit, or the same dynamic granularity);
    weight scales that give every output row its member's factor (per-tensor and per-channel members
    mix; 128x128 blocks only with blocks, and only where every member's N is a multiple of 128).
    ``_grouped``: the layers are already the members of one group (their class :class:`FusedFP8Linear`).
    """
    if len(layers) < 2:
        return "fewer than two layers"
    first = layers[0]
    for m in layers:
        if type(m) is not (FusedFP8Linear if _grouped else FP8Linear):
            return f"{type(m).__name__} is not a plain FP8Linear (already fused, or a subclass)"
        if m._parameters["weight"].device.type == "meta":
            return "weights on the meta device"
    w0 = first._parameters["weight"]
    kinds = {_weight_kind(m) for m in layers}
    for m in layers[1:]:
        w = m._parameters["weight"]
        if m.in_features != first.in_features:
            return f"in_features differ ({first.in_features} vs {m.in_features})"
        if w.dtype != w0.dtype:
            return f"FP8 formats differ ({w0.dtype} vs {w.dtype})"
        if w.device != w0.device:
            return f"devices differ ({w0.device} vs {w.device})"
        if m.__dict__.get("pinned_backend") != first.__dict__.get("pinned_backend"):
            return "pinned backends differ"
    sa = [m._parameters.get("input_scale") for m in layers]
    if any(s is None for s in sa):
        if not all(s is None for s in sa):
            return "static and dynamic activation scales mixed"
        grans = {m.scheme.activation_granularity for m in layers}
        if len(grans) != 1:
            return f"dynamic activation granularities differ ({sorted(grans)})"
    else:
        if any(s.shape != sa[0].shape or not torch.equal(s, sa[0]) for s in sa[1:]):
            vals = ", ".join(f"{float(s.reshape(-1)[0]):.6g}" for s in sa)
            return f"static input_scale values differ ({vals}): one quantization of the input cannot serve them all"
    if "block" in kinds:
        if kinds != {"block"}:
            return f"128x128 block weight scales mixed with {sorted(kinds - {'block'})} scales"
        bad = [m.out_features for m in layers if m.out_features % BLOCK_ROWS]
        if bad:
            return f"block weight scales need every member's N to be a multiple of {BLOCK_ROWS}, got N = {bad}"
    biases = [m._parameters.get("bias") for m in layers]
    dtypes = {b.dtype for b in biases if b is not None}
    if len(dtypes) > 1:
        return f"bias dtypes differ ({sorted(map(str, dtypes))})"
    return None


# ----------------------------------------------------------------------------------------- the group
def _register(group: "SiblingGroup") -> int:
    """A new key for ``group`` in :data:`_GROUPS` (the entry goes with the group)."""
    key = next(_keys)
    _GROUPS[key] = weakref.ref(group, lambda _ref, key=key: _GROUPS.pop(key, None))
    return key


class SiblingGroup(nn.Module):
    """One fused group: the fused ``FP8Linear`` (``fused``), the member modules with their row ranges
    (``bounds``), ``full`` (a bit per member) and whether it fuses now (``enabled``; ``disabled_reason``
    says why not). An ``nn.Module`` that no module tree holds (each member keeps it in its ``__dict__``
    as ``_fusion``; not a child: no parameter list, state dict or ``model.modules()`` sees it), so that
    a compiled forward reaches it from the module tree and dynamo's recursive dict-tag guards skip it
    while it is unchanged, as they skip the member. A forward's round is not kept here but in
    :data:`_ROUNDS` under ``key`` (a copy gets a new key): an attribute of the group set and reset by every
    forward would be a store replayed per group after a compiled graph (torch 2.13) and, on a module,
    would change the dict a dict-tag guard checks."""

    def __init__(self, parent_name: str, names: tuple[str, ...], members: list[FP8Linear], fused: FP8Linear):
        super().__init__()
        bounds, start = [], 0
        for m in members:
            bounds.append((start, start + m.out_features))
            start += m.out_features
        # plain attributes (``__dict__``), not registered: ``fused`` is no child module of the group either
        self.__dict__.update(parent_name=parent_name, names=names, members=members, fused=fused,
                             bounds=tuple(bounds), full=(1 << len(members)) - 1,
                             kinds=tuple(_weight_kind(m) for m in members), enabled=True,
                             exact_reason=None, runtime_reason=None)
        #: ``exact_reason``: why the members stopped being exact to fuse (a load of differing scales), or None;
        #: ``runtime_reason``: why a forward showed that the members do not read one tensor, or None.
        self.key = _register(self)

    @property
    def _state(self):
        """This group's open round in :data:`_ROUNDS` (``None`` outside its parent's forward)."""
        return _ROUNDS.get(self.__dict__.get("key"))

    def __getstate__(self):
        return self.__dict__.copy()  # no round: those live in _ROUNDS, not on the group

    def __setstate__(self, state) -> None:
        """A copy (``copy.deepcopy``, pickle) registers under a new key; members already copied follow it and
        are linked to the copied fused tensors again (``Parameter`` copies are independent clones: their views
        would be lost); the others do both in :meth:`FusedFP8Linear.__setstate__`."""
        self.__dict__.update(state)
        self.__dict__["key"] = _register(self)
        for i, m in enumerate(self.__dict__.get("members", ())):
            if m.__dict__.get("_fusion") is self:
                self.adopt(m, i)

    def adopt(self, member: "FusedFP8Linear", index: int) -> None:
        """``member`` (a copy's member ``index``) takes this group's key into its ``_fusion_slot`` and views
        its fused tensors again (:meth:`link`)."""
        member.__dict__["_fusion_slot"] = (self.key, *member.__dict__["_fusion_slot"][1:])
        self.link(index)

    def extra_repr(self) -> str:
        return f"{self.parent_name or 'model'}.{{{','.join(self.names)}}}, key={self.key}, enabled={self.enabled}"

    def _stop_fusing(self) -> None:
        """A forward ended with members that did not take the fused output: they do not all read one tensor
        here (cross-attention, shared key/value layers). Run them apart from now on."""
        self.enabled = False
        self.runtime_reason = (f"a forward of {self.parent_name or 'the model'} did not call every member "
                               "with the tensor the fused output was computed for")
        if not torch.compiler.is_compiling():
            logger.warning("fp8_linear: %s.{%s} no longer fused: %s", self.parent_name, ",".join(self.names),
                           self.runtime_reason)

    # ------------------------------------------------------------------ tensors
    def link(self, index: int) -> None:
        """Point member ``index``'s weight (and its per-channel / block scale and bias) at its rows of the
        fused tensors (views, no copy) and re-plan it."""
        m, (start, stop) = self.members[index], self.bounds[index]
        fp, mp = self.fused._parameters, self.members[index]._parameters
        mp["weight"] = nn.Parameter(fp["weight"][start:stop], requires_grad=False)
        kind = self.kinds[index]
        if kind == "channel":
            mp["weight_scale"] = nn.Parameter(fp["weight_scale"][start:stop], requires_grad=False)
        elif kind == "block":
            mp["weight_scale"] = nn.Parameter(fp["weight_scale"][start // BLOCK_ROWS:stop // BLOCK_ROWS],
                                              requires_grad=False)
        if mp.get("bias") is not None:
            mp["bias"] = nn.Parameter(fp["bias"][start:stop], requires_grad=False)
        m._try_prepare()

    def sync_member(self, index: int) -> None:
        """Copy member ``index``'s current tensors into its rows of the fused layer (after a
        ``load_state_dict`` or a replaced parameter), link it again, and check that one activation
        quantization still serves every member: where it no longer does, the group runs its members
        apart (``disabled_reason`` says why) until a later load makes it exact again."""
        start, stop = self.bounds[index]
        fp, mp = self.fused._parameters, self.members[index]._parameters
        with torch.no_grad():
            _copy_if_apart(fp["weight"][start:stop], mp["weight"])
            ws, kind = mp["weight_scale"], self.kinds[index]
            if kind == "tensor":
                fp["weight_scale"][start:stop].copy_(ws.detach().float().reshape(1, 1).expand(stop - start, 1))
            elif kind == "channel":
                _copy_if_apart(fp["weight_scale"][start:stop], ws)
            else:
                _copy_if_apart(fp["weight_scale"][start // BLOCK_ROWS:stop // BLOCK_ROWS], ws)
            if mp.get("bias") is not None:
                _copy_if_apart(fp["bias"][start:stop], mp["bias"])
        self.link(index)
        why = fusion_refusal(self.members, _grouped=True)
        if why is None:
            if fp.get("input_scale") is not None:
                with torch.no_grad():
                    fp["input_scale"].copy_(self.members[0]._parameters["input_scale"])
            self.exact_reason = None
        else:
            self.exact_reason = f"after load_state_dict the members are no longer exact to fuse: {why}"
        self._update()
        self.fused._try_prepare()

    def _update(self) -> None:
        self.enabled = self.exact_reason is None and self.runtime_reason is None

    @property
    def disabled_reason(self) -> str | None:
        """Why the group runs its members apart now, or ``None`` while it runs fused."""
        return self.exact_reason or self.runtime_reason

    def detach(self, parent: nn.Module) -> None:
        """Undo the fusion: every member gets its own contiguous tensors back (the same values) and
        becomes a plain ``FP8Linear``; ``parent`` forgets the group (and its hooks go with the last one)."""
        groups = tuple(g for g in parent.__dict__.get(_GROUPS_ATTR, ()) if g is not self)
        if groups:
            parent.__dict__[_GROUPS_ATTR] = groups
            parent.__dict__[_LEADS_ATTR] = _leads(groups)
        else:
            _remove_hooks(parent)
            parent.__dict__.pop(_GROUPS_ATTR, None)
            parent.__dict__.pop(_LEADS_ATTR, None)
        for m in self.members:
            mp = m._parameters
            for name in ("weight", "weight_scale", "bias"):
                t = mp.get(name)
                if t is not None:
                    mp[name] = nn.Parameter(t.detach().clone(), requires_grad=False)
            m.__class__ = FP8Linear
            for attr in ("_fusion", "_fusion_slot"):
                m.__dict__.pop(attr, None)
            m._try_prepare()
        _ROUNDS.pop(self.key, None)
        _GROUPS.pop(self.key, None)


def _copy_if_apart(dst: torch.Tensor, src: torch.Tensor) -> None:
    if src.data_ptr() != dst.data_ptr() or src.device != dst.device:
        dst.copy_(src.reshape(dst.shape))


#: Whether dynamo is tracing (a traced forward never reaches :func:`_split_plan`: it reads no setting).
_compiling = torch.compiler.is_compiling


def _split_plan(fused: FP8Linear, x: torch.Tensor):
    """The fused layer's plan where an eager fused group runs its members' GEMMs apart on one quantized input
    for ``x``, else ``None``: from
    ``FP8_LINEAR_SPLIT_ROWS`` rows (``settings.split_rows``; 0: never), without autograd, on a backend with a
    GEMM op for quantized inputs and for per-tensor / per-channel weight scales (block-scaled groups keep the
    fused output). The fused GEMM's output gives each member a column slice with the fused row stride, and
    eager pointwise ops on such views run PyTorch's strided kernels: in a Llama prefill of 2048 tokens the
    SiLU and the multiply on the gate / up slices took 2.7 + 2.6 ms a forward against 1.0 + 1.3 ms on
    contiguous outputs (H200, 2026-12-04, ``python -m benchmarks.prefill_profile --fuse``); a GEMM of
    prefill size costs the same run apart, and the input is still quantized once. Under ``torch.compile``
    inductor reads the slices in place, and at decode sizes one GEMM launch is what fusing saves, so both
    keep the fused output."""
    rows = settings.get().split_rows
    if rows == 0 or x.numel() < rows * fused.in_features or (x.requires_grad and torch.is_grad_enabled()):
        return None
    if x.dtype not in ACT_DTYPES or x.shape[-1] != fused.in_features or x.device != fused.weight.device:
        return None  # a bad input: the fused layer's own call checks it and raises
    plan = fused.current_plan()
    spec = plan.spec
    ok = plan.backend.gemm_op is not None and spec.weight_kind != SCALE_BLOCK and spec.activation_kind != "group"
    return plan if ok else None


def _quantize_once(fused: FP8Linear, plan, x: torch.Tensor) -> tuple:
    """``(q, scale_a)``: ``x`` quantized as the fused layer (its ``plan``), and so every member, quantizes it;
    ``q`` ``[M, K]``."""
    x2 = x.reshape(-1, plan.spec.k).contiguous()
    return quantize_activation(fused, x2, plan.spec)


def _member_gemm(member: FP8Linear, qa: tuple, x: torch.Tensor) -> torch.Tensor:
    """Member ``member``'s output for ``x`` from the group's quantized input ``qa`` (:func:`_quantize_once`): its
    own GEMM (its rows of the fused weight, its scale and bias) into a new contiguous ``[..., N_member]``."""
    plan = member.current_plan()
    if plan.backend.gemm_op is None:  # a member planned onto another backend than the group: its own call
        return FP8Linear.forward(member, x)
    p = member._parameters
    q, sa = qa
    out = plan.backend.gemm_op(q, p["weight"], sa, p["weight_scale"], p.get("bias"), x.dtype)
    return out.reshape(*x.shape[:-1], plan.spec.n)


class FusedFP8Linear(FP8Linear):
    """An ``FP8Linear`` whose weight rows live in a fused group's buffer (made by :func:`fuse_projections`,
    never constructed directly). Same parameters and state-dict keys as before fusing; ``forward(x)``
    (``[..., in_features]`` -> ``[..., out_features]``) returns its slice of the group's fused output,
    or runs its own GEMM when the group is not running fused for ``x``."""

    def __init__(self, *args, **kwargs):
        raise TypeError("FusedFP8Linear is made by fp8_linear.fuse_projections(model), not constructed directly")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Member ``index``'s output for ``x``: the column slice ``start:stop`` of the fused output when its
        group runs fused for this ``x``, else the member's own GEMM (its rows of the fused weight).

        A round starts when the parent's forward has a round open for the group (:data:`_ROUNDS`) with no
        fused output, and ``x`` is not the input of the round that just completed (a member called again on
        it runs apart); it completes when every member has taken its slice, which drops the fused output (the
        input stays named until the parent returns)."""
        # ``_fusion_slot``: (the group's key, this member's index, its first and last + 1 fused output column),
        # a tuple of ints in the member's own ``__dict__``: one dict-tag safe constant of a traced call. Only the
        # member that computes the fused output reaches the group (``_fusion``): with the parent's hooks, through
        # the lead member, one source for the group in the usual call order (no aliasing check).
        key, index, start, stop = self._fusion_slot
        state = _ROUNDS.get(key)
        if state is not None:
            src, out, served, full = state
            if out is None and src is not x:
                fused = self._fusion.fused
                plan = None if _compiling() else _split_plan(fused, x)
                if plan is not None:  # eager, prefill-sized: one quantization, the members' GEMMs apart
                    out = _quantize_once(fused, plan, x)
                    _ROUNDS[key] = (x, out, 1 << index, full)
                    return _member_gemm(self, out, x)
                out = FP8Linear.forward(fused, x)  # internal: no module call (and its guards)
                _ROUNDS[key] = (x, out, 1 << index, full)
                return out[..., start:stop]
            if src is x and out is not None and not (served >> index) & 1:
                served |= 1 << index
                _ROUNDS[key] = (x, None, 0, full) if served == full else (x, out, served, full)
                return _member_gemm(self, out, x) if isinstance(out, tuple) else out[..., start:stop]
        return FP8Linear.forward(self, x)

    def __setstate__(self, state) -> None:
        """A copy follows its copied group's key and views its copied fused tensors again (see
        :meth:`SiblingGroup.__setstate__`)."""
        super().__setstate__(state)
        group = self.__dict__.get("_fusion")
        if group is not None and "key" in group.__dict__:
            group.adopt(self, self._fusion_slot[1])

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Each member's tensors as independent contiguous copies (unless ``keep_vars``): the state dict,
        and so ``save_pretrained`` / ``save_quantized``, hold the unfused checkpoint's keys and values,
        with no storage shared between tensors (safetensors refuses shared storage)."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if keep_vars:
            return
        for name in ("weight", "weight_scale", "bias"):
            key = prefix + name
            if destination.get(key) is not None:
                destination[key] = destination[key].clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        """Loads as an ``FP8Linear`` does (into the member's views of the fused buffer), then brings the
        fused layer up to date (per-tensor scales, replaced parameters); a group whose loaded activation
        scales no longer agree runs its members apart (:meth:`SiblingGroup.sync_member`)."""
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        group = self.__dict__.get("_fusion")
        if group is not None:
            group.sync_member(self._fusion_slot[1])

    def _apply(self, fn, recurse=True):
        """Device moves and casts: ``fn`` applies to the group's fused layer (each member applies it; on a
        tensor already moved a move is free), the member's own tensors follow, and its weight rows are
        views of the moved buffer again."""
        group = self.__dict__.get("_fusion")
        if group is None:
            return super()._apply(fn, recurse)
        group.fused._apply(fn)
        out = super()._apply(fn, recurse)
        group.link(self._fusion_slot[1])
        return out

    def extra_repr(self) -> str:
        group = self.__dict__.get("_fusion")
        base = super().extra_repr()
        if group is None:
            return base
        _, _, start, stop = self._fusion_slot
        state = "fused" if group.enabled else "unfused at run time"
        return f"{base}, {state} with {'/'.join(group.names)} (rows {start}:{stop} of {group.bounds[-1][1]})"


# ----------------------------------------------------------------------------------------- building
def _fused_layer(members: list[FP8Linear]) -> FP8Linear:
    """One ``FP8Linear`` ``[sum N, K]`` equal, row block by row block, to ``members`` (checked exact)."""
    first = members[0]
    kinds = {_weight_kind(m) for m in members}
    kind = "block" if kinds == {"block"} else "channel"
    biases = [m._parameters.get("bias") for m in members]
    bias_dtype = next((b.dtype for b in biases if b is not None), torch.float32)
    n = sum(m.out_features for m in members)
    scheme = first.scheme.with_(weight_granularity=kind, name=f"{first.scheme.name} (fused)")
    fused = FP8Linear(first.in_features, n, any(b is not None for b in biases), scheme, device="meta",
                      bias_dtype=bias_dtype)
    fp = fused._parameters
    with torch.no_grad():
        fp["weight"] = nn.Parameter(torch.cat([m._parameters["weight"].detach() for m in members]), requires_grad=False)
        if kind == "block":
            ws = torch.cat([m._parameters["weight_scale"].detach().float() for m in members])
        else:
            ws = torch.cat([m._parameters["weight_scale"].detach().float().reshape(-1, 1).expand(m.out_features, 1)
                            for m in members])
        fp["weight_scale"] = nn.Parameter(ws.contiguous(), requires_grad=False)
        if first._parameters.get("input_scale") is not None:
            fp["input_scale"] = nn.Parameter(first._parameters["input_scale"].detach().float().clone(), requires_grad=False)
        if fp.get("bias") is not None:
            fp["bias"] = nn.Parameter(torch.cat([
                (b.detach() if b is not None else torch.zeros(m.out_features, dtype=bias_dtype, device=fp["weight"].device))
                for m, b in zip(members, biases)]), requires_grad=False)
    pinned = first.__dict__.get("pinned_backend")
    if pinned:
        fused.__dict__["pinned_backend"] = pinned
    fused._try_prepare()
    return fused


def _leads(groups) -> tuple[tuple[str, int], ...]:
    """A parent's ``_fusion_leads``: ``(first member's name, full)`` of each of its ``groups``."""
    return tuple((g.names[0], g.full) for g in groups)


def _open_groups(module: nn.Module, args) -> None:
    """Forward pre-hook of a parent: its groups that fuse may fuse during this forward (a round opened in
    :data:`_ROUNDS`). A group is reached through its first member (``_fusion_leads``), as the parent's forward
    reaches the members: under ``torch.compile`` the same sources, and what is read is the member's slot (the
    key) and the group's ``enabled``."""
    children = module._modules
    for name, full in module._fusion_leads:
        lead = children[name]
        if lead._fusion.enabled:
            _ROUNDS[lead._fusion_slot[0]] = (None, None, 0, full)


def _close_groups(module: nn.Module, args, *_kwargs_output) -> None:
    """Forward hook (``always_call``, ``with_kwargs``: called with the parent's kwargs and output, ignored) of
    a parent: its rounds are removed (nothing of this forward stays cached); a group with members not served
    stops fusing."""
    children = module._modules
    for name, _ in module._fusion_leads:
        lead = children[name]
        state = _ROUNDS.pop(lead._fusion_slot[0], None)
        if state is not None and state[1] is not None:
            SiblingGroup._stop_fusing(lead._fusion)


def _remove_hooks(parent: nn.Module) -> None:
    """Remove :func:`_open_groups` / :func:`_close_groups` from ``parent`` (found by identity, so that a
    deep copy, whose hook dicts are copies, removes its own)."""
    for hooks in (parent._forward_pre_hooks, parent._forward_hooks):
        for key in [k for k, fn in hooks.items() if fn is _open_groups or fn is _close_groups]:
            del hooks[key]
            parent._forward_hooks_always_called.pop(key, None)
            parent._forward_hooks_with_kwargs.pop(key, None)
            parent._forward_pre_hooks_with_kwargs.pop(key, None)


def _attach(model: nn.Module, parent_name: str, names: tuple[str, ...]) -> FusedGroupInfo:
    parent = model.get_submodule(parent_name) if parent_name else model
    members = [getattr(parent, n) for n in names]
    fused = _fused_layer(members)
    group = SiblingGroup(parent_name, names, members, fused)
    for i, m in enumerate(members):
        m.__class__ = FusedFP8Linear
        m.__dict__["_fusion"] = group
        m.__dict__["_fusion_slot"] = (group.key, i, *group.bounds[i])
        group.link(i)
    if _GROUPS_ATTR not in parent.__dict__:
        parent.register_forward_pre_hook(_open_groups)
        # with_kwargs: torch's _call_impl then tests the hook's id in the parent's own with-kwargs dict (a
        # dict-tag safe guard) and never in the global one (a guard per hooked parent on every compiled call)
        parent.register_forward_hook(_close_groups, with_kwargs=True, always_call=True)
    parent.__dict__[_GROUPS_ATTR] = parent.__dict__.get(_GROUPS_ATTR, ()) + (group,)
    parent.__dict__[_LEADS_ATTR] = _leads(parent.__dict__[_GROUPS_ATTR])
    return FusedGroupInfo(parent_name, names, tuple(m.out_features for m in members), fused.in_features,
                          _weight_kind(fused))


def _candidates(model: nn.Module, patterns) -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for pname, parent in model.named_modules():
        children = dict(parent.named_children())
        cross = any(h in pname.rsplit(".", 1)[-1].lower() for h in CROSS_ATTENTION_HINTS)
        taken: set[str] = set()
        for pat in (CROSS_ATTENTION_PATTERNS if cross else ()) + tuple(patterns):
            if all(n in children for n in pat) and not taken & set(pat):
                found.append((pname, tuple(pat)))
                taken |= set(pat)
    return found


def _split_name(full: str) -> tuple[str, str]:
    parent, _, child = full.rpartition(".")
    return parent, child


def fuse_projections(model: nn.Module, groups=None, patterns=DEFAULT_PATTERNS) -> FusionReport:
    """Fuse sibling ``FP8Linear`` layers that read one input into one activation quantization + one GEMM
    each, in place (docs/serving.md, "Fused projections").

    Args:
        model: any ``nn.Module`` (a transformers model), its FP8 layers already on their device.
        groups: explicit groups, each a sequence of qualified module names with one parent, e.g.
            ``[["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"]]``; when given,
            only these are fused, and one that cannot be fused exactly raises :class:`FusionError`.
        patterns: child-name tuples looked for in every module when ``groups`` is None (default
            :data:`DEFAULT_PATTERNS`: ``q_proj/k_proj/v_proj``, ``gate_proj/up_proj`` and the BERT and T5
            names); in a parent named like cross-attention (:data:`CROSS_ATTENTION_HINTS`) key and value
            only. A candidate whose members are not all ``FP8Linear`` or not exact to fuse is skipped and
            reported.

    Returns:
        a :class:`FusionReport` (``print`` it). Each fused group's members keep their names, classes
        (a subclass of ``FP8Linear``), parameters and state-dict keys; their weights (and per-channel /
        block scales and biases) are row views of the fused buffer ``[sum N, K]`` (FP8, row-major).

    Fuse after moving the model to its device (moves keep working, at the cost of one transient copy of
    each member) and before ``torch.compile``. Saving writes the unfused checkpoint's keys and values;
    :func:`unfuse_projections` undoes the fusion exactly.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    report = FusionReport()
    if groups is not None:
        if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
            raise TypeError(f"groups: expected a list of lists of module names, got {type(groups).__name__}")
        todo = []
        for g in groups:
            if isinstance(g, (str, bytes)) or not hasattr(g, "__iter__"):
                raise TypeError(f"groups: each group must be a list of module names, got {g!r}")
            names = list(g)
            if len(names) < 2 or len(set(names)) != len(names):
                raise FusionError(f"groups: a group needs two or more distinct module names, got {names}")
            split = [_split_name(str(n)) for n in names]
            parents = {p for p, _ in split}
            if len(parents) != 1:
                raise FusionError(f"groups: the members of a group must share one parent module, got {names}")
            parent = parents.pop()
            layers = []
            for n in names:
                try:
                    layers.append(model.get_submodule(n))
                except AttributeError as e:
                    raise FusionError(f"groups: model has no module {n!r}") from e
            if any(not isinstance(m, FP8Linear) for m in layers):
                raise FusionError(f"groups: {names}: every member must be an FP8Linear, got "
                                  f"{[type(m).__name__ for m in layers]}")
            why = fusion_refusal(layers)
            if why is not None:
                raise FusionError(f"groups: {names} cannot be fused exactly: {why}")
            todo.append((parent, tuple(c for _, c in split)))
        claimed = [n for p, cs in todo for n in (f"{p}.{c}" if p else c for c in cs)]
        if len(claimed) != len(set(claimed)):
            raise FusionError("groups: a module appears in more than one group")
        for parent, names in todo:
            report.fused.append(_attach(model, parent, names))
        return report
    for pat in patterns:
        if isinstance(pat, (str, bytes)) or len(tuple(pat)) < 2:
            raise TypeError(f"patterns: expected tuples of two or more child names, got {pat!r}")
    for parent_name, names in _candidates(model, patterns):
        parent = model.get_submodule(parent_name) if parent_name else model
        layers = [getattr(parent, n) for n in names]
        if not all(isinstance(m, FP8Linear) for m in layers):
            if any(isinstance(m, FP8Linear) for m in layers):
                report.skipped.append(SkippedGroup(parent_name, names, "not every member is an FP8Linear: "
                                                   + ", ".join(type(m).__name__ for m in layers)))
            continue
        why = fusion_refusal(layers)
        if why is not None:
            report.skipped.append(SkippedGroup(parent_name, names, why))
            continue
        report.fused.append(_attach(model, parent_name, names))
    return report


def fusion_groups(model: nn.Module) -> list[SiblingGroup]:
    """The fused groups of ``model``, each once, in module order."""
    seen, out = set(), []
    for m in model.modules():
        g = m.__dict__.get("_fusion") if isinstance(m, FusedFP8Linear) else None
        if g is not None and id(g) not in seen:
            seen.add(id(g))
            out.append(g)
    return out


def unfuse_projections(model: nn.Module) -> int:
    """Undo :func:`fuse_projections` in place: every member becomes a plain ``FP8Linear`` again with its
    own contiguous weight, scale and bias (bitwise the values it had before fusing), the parents' hooks
    are removed. Returns the number of groups undone. A model compiled while fused keeps its compiled
    code: compile again after unfusing (``torch._dynamo.reset()``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    groups = fusion_groups(model)
    for g in groups:
        g.detach(model.get_submodule(g.parent_name) if g.parent_name else model)
    return len(groups)


def launched_layers(modules) -> list[FP8Linear | nn.Module]:
    """The layers a forward launches, from ``modules`` in call order: each fused group's fused
    ``FP8Linear`` once, at its first member, in place of its members; other modules as they are
    (for timing the GEMMs of a step)."""
    out, seen = [], set()
    for m in modules:
        g = m.__dict__.get("_fusion") if isinstance(m, FusedFP8Linear) else None
        if g is None or not g.enabled:
            out.append(m)
        elif id(g) not in seen:
            seen.add(id(g))
            out.append(g.fused)
    return out


__all__ = ["DEFAULT_PATTERNS", "FusedFP8Linear", "FusedGroupInfo", "FusionError", "FusionReport", "SiblingGroup",
           "SkippedGroup", "fuse_projections", "fusion_groups", "fusion_refusal", "launched_layers",
           "unfuse_projections"]
