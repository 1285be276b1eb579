"""Fused MoE experts <-> the per-expert checkpoint layout vLLM and llm-compressor read and write.

In memory an experts module is fused (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``,
see ``fp8_linear/moe/experts.py``); on disk every expert is a set of Linear layers, as in the original
Hugging Face checkpoints and in compressed-tensors MoE checkpoints::

    <prefix>.experts.{e}.gate_proj.weight        F8_E4M3 [I, H]
    <prefix>.experts.{e}.gate_proj.weight_scale  F32 [1] | [I, 1] | [ceil(I/128), ceil(H/128)]
    <prefix>.experts.{e}.gate_proj.input_scale   F32 [1]             (static schemes)
    <prefix>.experts.{e}.up_proj.*               (same; ``up_proj`` alone when the experts have no gate)
    <prefix>.experts.{e}.down_proj.*             F8_E4M3 [H, I], ...
    <prefix>.experts.{e}.<proj>.bias             (experts with biases)

Saving (:func:`expert_state_dict`, :func:`amend_config`): the fused tensors are split per expert and
the routers (the experts' sibling modules with a 2-D weight that are no ``nn.Linear``, e.g.
``mlp.gate``) join the ``ignore`` list, as llm-compressor writes them. Loading (:class:`ExpertsLoad`):
each fused experts module of the model built on the meta device becomes an FP8 one when the
quantization config targets its per-expert Linear layers (``Linear``, exact names or ``re:``), the
per-expert tensors are checked (names, dtypes, shapes, completeness, finite positive scales) and
copied into the fused tensors; an experts module the config leaves unquantized gets its BF16
per-expert weights merged the same way. Gate and up static input scales that differ (they see the
same tokens) are merged by their max, as vLLM does. The stored-suffix renames of the plan apply
(``weight_scale_inv`` of DeepSeek-style ``fp8`` block checkpoints).
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from ..errors import CheckpointError, FP8LinearError
from ..formats import GROUP_SIZE, SCALE_DTYPE
from ..moe import hf
from ..moe.experts import FP8Experts, part_rows
from .plan import QuantPlan

#: Per-expert module names of each fused projection and part, as the checkpoints spell them.
GATED_PARTS = ("gate_proj", "up_proj")
UNGATED_PARTS = ("up_proj",)
DOWN = "down_proj"
_EXPERT_KEY = re.compile(r"^(\d+)\.(\w+)\.(\w+)$")


def _parts(mod: nn.Module) -> list[tuple[str, str, int, int]]:
    """``(fused name, per-expert name, part index, parts)`` of every stored per-expert Linear of ``mod``."""
    gated = bool(getattr(mod, "has_gate", True))
    first = "gate_up_proj" if gated else "up_proj"
    names = GATED_PARTS if gated else UNGATED_PARTS
    return [(first, n, p, len(names)) for p, n in enumerate(names)] + [(DOWN, DOWN, 0, 1)]


# ---------------------------------------------------------------------------------------------- save
def _split_fp8(prefix: str, mod: FP8Experts) -> dict[str, torch.Tensor]:
    out = {}
    gran = mod.scheme.weight_granularity
    concat = mod.fp8_layout["concatenated"]
    for fused, part, p, parts in _parts(mod):
        w, s = getattr(mod, fused), getattr(mod, f"{fused}_scale")
        static = getattr(mod, f"{fused}_input_scale")
        bias = getattr(mod, f"{fused}_bias", None)
        for e in range(mod.num_experts):
            key = f"{prefix}{e}.{part}."
            out[key + "weight"] = part_rows(w[e], p, parts, concat).contiguous()
            if gran == "tensor":
                out[key + "weight_scale"] = s[e, p].reshape(1).clone()
            elif gran == "channel":
                out[key + "weight_scale"] = part_rows(s[e], p, parts, concat).contiguous()
            else:
                out[key + "weight_scale"] = s[e, p].contiguous()
            if static is not None:
                out[key + "input_scale"] = static[e].reshape(1).clone()
            if isinstance(bias, torch.Tensor):
                out[key + "bias"] = part_rows(bias[e].unsqueeze(-1), p, parts, concat).squeeze(-1).contiguous()
    return out


def expert_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """``model.state_dict()`` with every :class:`FP8Experts` split into per-expert tensors (module
    docstring); ``None`` when the model has none (then nothing changes)."""
    fp8 = {n: m for n, m in model.named_modules() if isinstance(m, FP8Experts)}
    if not fp8:
        return None
    for name, mod in fp8.items():
        try:
            mod.check()
        except (FP8LinearError, TypeError, ValueError) as e:
            raise CheckpointError(f"model.{name}: cannot save invalid FP8 experts ({e})") from e
    sd = model.state_dict()
    for name, mod in fp8.items():
        prefix = f"{name}." if name else ""
        own = {prefix + k for k in dict(mod.named_parameters(recurse=False))} | {prefix + k for k, _ in mod.named_buffers(recurse=False)}
        for k in own & set(sd):
            del sd[k]
        sd.update(_split_fp8(prefix, mod))
    return sd


def save_kwargs(model: nn.Module) -> dict:
    """Extra ``save_pretrained`` arguments for ``model``: the per-expert ``state_dict`` when it has FP8 experts."""
    sd = expert_state_dict(model)
    return {} if sd is None else {"state_dict": sd}


def routers(model: nn.Module) -> list[str]:
    """Names of the routers of fused experts (FP8 or not): sibling modules holding a 2-D float ``weight``
    that are not Linear layers."""
    out = []
    names = {m: n for n, m in model.named_modules()}
    for name, mod in model.named_modules():
        if not isinstance(mod, FP8Experts) and not hf.is_fused_experts(mod):
            continue
        parent_name = name.rpartition(".")[0]
        parent = model.get_submodule(parent_name) if parent_name else model
        for child in parent.children():
            w = getattr(child, "weight", None)
            if child is mod or isinstance(child, (nn.Linear, nn.Embedding, FP8Experts)) or not isinstance(w, torch.Tensor):
                continue
            if w.dim() == 2 and w.dtype.is_floating_point:
                out.append(names[child])
    return out


def _expert_pattern(name: str) -> str:
    return f"re:^{re.escape(name)}\\.\\d+\\.({'|'.join(GATED_PARTS + (DOWN,))})$"


def amend_config(model: nn.Module, groups: list, ignore: list[str]) -> tuple[list, list[str]]:
    """``(groups, ignore)`` of ``quantized_groups`` with the FP8 experts covered: a group whose targets
    are ``["Linear"]`` covers their per-expert Linear layers (vLLM and compressed-tensors read it so);
    otherwise their per-expert names join the group of their scheme (a new one, first, if none). The
    routers and the per-expert names of experts left unquantized join ``ignore``."""
    fp8 = {n: m for n, m in model.named_modules() if isinstance(m, FP8Experts)}
    plain = [_expert_pattern(n) for n in hf.find_fused_experts(model)]  # experts left in high precision
    extra = plain + [r for r in routers(model) if r not in ignore]
    if not fp8:
        return groups, list(ignore) + extra
    groups = [(list(t), s) for t, s in groups]
    for name, mod in fp8.items():
        same = next((g for g in groups if g[1] == mod.scheme), None)
        if same is not None and same[0] == ["Linear"]:
            continue
        if same is None:
            same = ([], mod.scheme)
            groups.insert(0, same)
        same[0].append(_expert_pattern(name))
    return groups, list(ignore) + extra


# ---------------------------------------------------------------------------------------------- load
def _probe(rows: int, cols: int) -> nn.Linear:
    return nn.Linear(cols, rows, bias=False, device="meta")


class ExpertsLoad:
    """The fused experts modules of a model being loaded, and the stored per-expert tensors they own.

    ``ExpertsLoad(model, plan, stored, dtype)`` swaps each fused experts module for a meta
    :class:`FP8Experts` where ``plan`` quantizes it, takes its tensors out of ``stored`` (a dict
    ``key -> TensorInfo``, changed in place) after checking every header, and detaches the modules
    from ``model`` (so the dense loader neither expects nor sees them); :meth:`materialize` reads
    the tensors, fills the fused tensors and puts the modules back.
    """

    def __init__(self, model: nn.Module, plan: QuantPlan, stored: dict, dtype: torch.dtype | None):
        self.model, self.plan, self.dtype = model, plan, dtype
        self.modules: dict[str, nn.Module] = {}
        self.owned: dict[str, dict[str, str]] = {}  # module name -> {stored key: local name}
        self.infos: dict[str, object] = {}
        prefix = getattr(model, "base_model_prefix", "") or ""
        for name, src in hf.find_fused_experts(model).items():
            scheme = self._scheme(name, src)
            mod = FP8Experts.empty_like(src, scheme, device="meta") if scheme is not None else src
            self.modules[name] = mod
            stored_prefix = self._stored_prefix(name, prefix, stored)
            owned = {k: k[len(stored_prefix):] for k in list(stored) if k.startswith(stored_prefix)}
            self.infos.update({k: stored.pop(k) for k in owned})
            self.owned[name] = owned
            self._check_headers(name, mod, owned)
        for name in self.modules:
            self._set(name, nn.Module())

    # ---------------------------------------------------------------- planning
    def _scheme(self, name: str, src: nn.Module):
        schemes = set()
        for fused, part, _, parts in _parts(src):
            w = getattr(src, fused)
            rows, cols = (w.shape[2], w.shape[1]) if getattr(src, "is_transposed", False) else (w.shape[1], w.shape[2])
            schemes.add(self.plan.scheme_for(f"{name}.0.{part}", _probe(rows // parts, cols)))
        if len(schemes) != 1:
            raise CheckpointError(f"quantization_config ({self.plan.method}): the experts of {name} are partly quantized "
                                  f"({sorted(str(s and s.name) for s in schemes)}); expected all or none")
        return schemes.pop()

    @staticmethod
    def _stored_prefix(name: str, prefix: str, stored: dict) -> str:
        cands = [name]
        if prefix and name.startswith(prefix + "."):
            cands.append(name[len(prefix) + 1:])
        elif prefix:
            cands.append(f"{prefix}.{name}")
        for c in cands:
            if any(k.startswith(c + ".") for k in stored):
                return c + "."
        return name + "."

    def _expected(self, mod: nn.Module) -> dict[str, tuple[str, tuple[int, ...], str, int, int]]:
        """Stored local name (``{e}.{part}.{tensor}``) -> (kind, shape, fused name, expert, part)."""
        fp8 = isinstance(mod, FP8Experts)
        exp = {}
        e_count = mod.fp8_layout["num_experts"] if fp8 else getattr(mod, _parts(mod)[0][0]).shape[0]
        for fused, part, p, parts in _parts(mod):
            if fp8:
                rows = dict((n, r) for n, r, _, _ in mod.projections())[fused] // parts
                cols = dict((n, c) for n, _, c, _ in mod.projections())[fused]
            else:
                w = getattr(mod, fused)
                rows, cols = (w.shape[2], w.shape[1]) if getattr(mod, "is_transposed", False) else (w.shape[1], w.shape[2])
                rows //= parts
            for e in range(e_count):
                key = f"{e}.{part}."
                exp[key + "weight"] = ("weight", (rows, cols), fused, e, p)
                if getattr(mod, "has_bias", False) and isinstance(getattr(mod, f"{fused}_bias", None), torch.Tensor):
                    exp[key + "bias"] = ("bias", (rows,), fused, e, p)
                if fp8:
                    gran = mod.scheme.weight_granularity
                    shape = {"tensor": (1,), "channel": (rows, 1),
                             "block": (math.ceil(rows / GROUP_SIZE), math.ceil(cols / GROUP_SIZE))}[gran]
                    exp[key + "weight_scale"] = ("weight_scale", shape, fused, e, p)
                    if mod.scheme.static:
                        exp[key + "input_scale"] = ("input_scale", (1,), fused, e, p)
        return exp

    def _check_headers(self, name: str, mod: nn.Module, owned: dict[str, str]) -> None:
        from .load import FLOAT_ST_DTYPES, FP8_ST_DTYPES, SCALE_ST_DTYPES

        exp = self._expected(mod)
        fp8 = isinstance(mod, FP8Experts)
        seen = set()
        for skey, local in owned.items():
            m = _EXPERT_KEY.match(local)
            if m is None:
                raise CheckpointError(f"{skey}: unexpected tensor (the experts of {name} are stored per expert: "
                                      f"{name}.{{e}}.<proj>.weight, not fused)")
            suffix = m.group(3)
            if suffix in self.plan.zero_points:
                continue
            local = f"{m.group(1)}.{m.group(2)}.{self.plan.fp8_name(suffix)}"
            owned[skey] = local
            if local not in exp:
                raise CheckpointError(f"{skey}: unexpected tensor in {self.infos[skey].file} (experts {name}: "
                                      f"{'FP8 with scheme ' + mod.scheme.name if fp8 else 'unquantized'})")
            kind, shape, *_ = exp[local]
            info = self.infos[skey]
            want = ((FP8_ST_DTYPES[mod.scheme.fmt],) if fp8 and kind == "weight" else
                    SCALE_ST_DTYPES if kind.endswith("scale") else FLOAT_ST_DTYPES)
            if info.dtype not in want:
                raise CheckpointError(f"{skey}: expected {'/'.join(want)}, got {info.dtype} in {info.file}")
            ok = tuple(info.shape) == shape or (kind.endswith("scale") and math.prod(info.shape) == math.prod(shape)
                                                 and (shape == (1,) or (len(shape) == 2 and shape[1] == 1 and len(info.shape) == 1)))
            if not ok:
                raise CheckpointError(f"{skey}: expected shape {list(shape)}, got {list(info.shape)} in {info.file}")
            seen.add(local)
        missing = sorted(set(exp) - seen, key=lambda k: (int(k.split(".")[0]), k))
        if missing:
            raise CheckpointError(f"{name}.{missing[0]}: missing from the checkpoint ({len(missing)} per-expert tensors "
                                  f"of {name} missing; expected shape {list(exp[missing[0]][1])})")

    def _set(self, name: str, mod: nn.Module) -> None:
        parent, _, child = name.rpartition(".")
        setattr(self.model.get_submodule(parent) if parent else self.model, child, mod)

    # ---------------------------------------------------------------- reading
    def materialize(self, folder, device) -> None:
        """Read the owned tensors from ``folder`` (a ``CheckpointFolder``) onto ``device``, fill the fused
        tensors and put the experts modules back into the model."""
        from safetensors import safe_open

        from .load import check_fp8_weight, check_scale

        for name, mod in self.modules.items():
            fp8 = isinstance(mod, FP8Experts)
            exp = self._expected(mod)
            fused = self._allocate(mod, device)
            in_scales: dict[str, torch.Tensor] = {}
            by_file: dict[str, list[str]] = {}
            for skey in self.owned[name]:
                by_file.setdefault(self.infos[skey].name, []).append(skey)
            for fname, keys in by_file.items():
                try:
                    with safe_open(folder.path_of(fname), framework="pt", device=str(device)) as f:
                        for skey in keys:
                            local = self.owned[name][skey]
                            info = self.infos[skey]
                            t = f.get_tensor(skey)
                            if local not in exp:  # a symmetric zero point
                                if t.float().abs().max().item() != 0:
                                    raise CheckpointError(f"{skey}: expected all-zero (symmetric) zero points, got non-zero values")
                                continue
                            kind, shape, proj, e, p = exp[local]
                            self._place(mod, fused, in_scales, skey, info, t, kind, shape, proj, e, p,
                                        check_fp8_weight, check_scale)
                except CheckpointError:
                    raise
                except Exception as err:  # safetensors raises its own error types for corrupt data
                    raise CheckpointError(f"{folder.display(fname)}: cannot read tensors ({type(err).__name__}: {err})") from err
            for k, t in {**fused, **in_scales}.items():
                mod._parameters[k] = nn.Parameter(t, requires_grad=False)
            if fp8:
                try:
                    mod.check()
                except (FP8LinearError, TypeError, ValueError) as err:
                    raise CheckpointError(f"{name}: {err}") from err
            self._set(name, mod)

    def _allocate(self, mod: nn.Module, device) -> dict[str, torch.Tensor]:
        out = {}
        if isinstance(mod, FP8Experts):
            for proj, *_ in mod.projections():
                for k in (proj, f"{proj}_scale", f"{proj}_bias"):
                    t = getattr(mod, k, None)
                    if isinstance(t, torch.Tensor):
                        out[k] = torch.empty(t.shape, dtype=t.dtype, device=device)
            return out
        for proj in dict.fromkeys(f for f, *_ in _parts(mod)):
            for k in (proj, f"{proj}_bias"):
                t = getattr(mod, k, None)
                if isinstance(t, torch.Tensor):
                    out[k] = torch.empty(t.shape, dtype=self.dtype or t.dtype, device=device)
        return out

    def _place(self, mod, fused, in_scales, skey, info, t, kind, shape, proj, e, p, check_fp8_weight, check_scale):
        fp8 = isinstance(mod, FP8Experts)
        parts = 2 if proj == "gate_up_proj" else 1
        concat = mod.fp8_layout["concatenated"] if fp8 else bool(getattr(mod, "is_concatenated", True))
        if kind == "weight":
            if fp8:
                check_fp8_weight(skey, t, info, mod.scheme.fmt)
                part_rows(fused[proj][e], p, parts, concat).copy_(t)
            else:
                dst = fused[proj][e]
                dst = dst.t() if getattr(mod, "is_transposed", False) else dst
                part_rows(dst, p, parts, concat).copy_(t.to(dst.dtype))
        elif kind == "bias":
            b = fused[f"{proj}_bias"][e].unsqueeze(-1)
            part_rows(b, p, parts, concat).copy_(t.reshape(-1, 1).to(b.dtype))
        elif kind == "weight_scale":
            check_scale(skey.rpartition(".")[0], kind, t, info, mod.scheme.fmt)
            s = t.to(SCALE_DTYPE).reshape(shape)
            dst = fused[f"{proj}_scale"]
            gran = mod.scheme.weight_granularity
            if gran == "tensor":
                dst[e, p] = s.reshape(())
            elif gran == "channel":
                part_rows(dst[e], p, parts, concat).copy_(s)
            else:
                dst[e, p] = s
        else:  # input_scale: gate and up see the same tokens; a differing pair is merged by its max
            check_scale(skey.rpartition(".")[0], kind, t, info, mod.scheme.fmt)
            cur = in_scales.setdefault(f"{proj}_input_scale", torch.zeros(mod.num_experts, dtype=SCALE_DTYPE, device=t.device))
            cur[e] = torch.maximum(cur[e], t.to(SCALE_DTYPE).reshape(()))
