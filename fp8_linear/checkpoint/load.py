"""``load_quantized``: any supported FP8 checkpoint -> a model of ``FP8Linear`` modules.

The model is built from ``config.json`` on the meta device (``accelerate.init_empty_weights``),
the Linear modules the quantization config targets become :class:`FP8Linear` of the equivalent
scheme, every header is checked against the model (names, dtypes, shapes, index, truncation)
before any tensor is read, and then only the stored tensors are materialized, one at a time,
straight from the safetensors files: peak memory is about the checkpoint size, never a
bf16 copy of the model. Any mismatch raises :class:`CheckpointError` naming the tensor or file.
"""

from __future__ import annotations

import logging
import math
import os
import re

import torch
from torch import nn

from ..embedding import unsaved_parameters
from ..errors import CheckpointError, DeviceError, FP8LinearError
from ..formats import FORMATS, SCALE_DTYPE
from ..module import FP8Linear
from .devices import Placement, resolve_device_map
from .embeddings import swap_embeddings
from .folder import CheckpointFolder, folder_path
from .model_config import CONFIG_FILE, build_config, build_empty_model
from .plan import QuantPlan
from .readers import read_plan
from .save import INCOMPLETE_MARKER, interrupted_save_hint
from .shards import TensorInfo, list_tensors
from .values import check_fp8_weight, check_scale  # noqa: F401  (experts.py imports them from here)

log = logging.getLogger(__name__)

#: safetensors dtype strings of the FP8 formats, and of the dtypes a scale may be stored in.
FP8_ST_DTYPES = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}
FLOAT_ST_DTYPES = ("F64", "F32", "F16", "BF16")
SCALE_ST_DTYPES = FLOAT_ST_DTYPES + ("F8_E8M0",)
ST_DTYPE_OF = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}
SCALE_NAMES = ("weight_scale", "input_scale")


def _swap_linears(model: nn.Module, plan: QuantPlan, dtype: torch.dtype | None) -> dict[str, FP8Linear]:
    """Replace every ``nn.Linear`` the plan quantizes by a meta :class:`FP8Linear`; ``{name: module}``."""
    swapped = {}
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if plan.keep_output_embeddings and callable(get_head) else None
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or mod is head:
            continue
        scheme = plan.scheme_for(name, mod)
        if scheme is None:
            continue
        bias_dtype = dtype or (mod.bias.dtype if mod.bias is not None else torch.float32)
        new = FP8Linear(mod.in_features, mod.out_features, mod.bias is not None, scheme, device="meta", bias_dtype=bias_dtype)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        swapped[name] = new
    if not swapped:
        raise CheckpointError(f"quantization_config ({plan.method}): targets no Linear module of the model")
    return swapped


def _state_entries(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    """``(entries, alias_groups)``: every state-dict name -> its (meta) tensor, and the parameter names
    grouped by parameter (tied weights share one). Persistent buffers are entries but may be absent
    (they are built for real, not on meta)."""
    entries, by_id = {}, {}
    unsaved = unsaved_parameters(model)  # FP8Embedding.dtype_anchor: a dtype, no data
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in unsaved:
            continue
        entries[name] = p
        by_id.setdefault(id(p), []).append(name)
    for mname, mod in model.named_modules(remove_duplicate=False):
        for bname, b in mod._buffers.items():
            if b is not None and bname not in mod._non_persistent_buffers_set:
                full = f"{mname}.{bname}" if mname else bname
                entries[full] = b
    return entries, list(by_id.values())


def _skippable(model: nn.Module):
    """Predicate of stored names transformers itself ignores at load: non-persistent buffers that older
    versions saved (``embeddings.position_ids``, ``rotary_emb.inv_freq``) and the model class's
    ``_keys_to_ignore_on_load_unexpected`` patterns."""
    names = {f"{m}.{b}" if m else b for m, mod in model.named_modules() for b in mod._non_persistent_buffers_set}
    patterns = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])]
    return lambda key: key in names or any(p.search(key) for p in patterns)


def _key_mapper(stored: set[str], expected: set[str], prefix: str):
    """Map stored names onto the model's: identity, or adding / stripping ``base_model_prefix``."""
    cands = [lambda k: k]
    if prefix:
        p = prefix + "."
        cands += [lambda k: k[len(p):] if k.startswith(p) else k, lambda k: p + k]
    return max(cands, key=lambda f: sum(f(k) in expected for k in stored))


def _check_float(key: str, info: TensorInfo, allowed: tuple[str, ...], what: str) -> None:
    if info.dtype not in allowed:
        raise CheckpointError(f"{key}: expected {what} ({'/'.join(allowed)}), got {info.dtype} in {os.path.basename(info.file)}")


def _fp8_expectation(key: str, info: TensorInfo, mod: FP8Linear, pname: str) -> tuple[int, ...]:
    """Validate a stored FP8Linear tensor's dtype and shape; the shape to reshape it to."""
    fname = os.path.basename(info.file)
    if pname == "weight":
        want = FP8_ST_DTYPES[mod.scheme.fmt]
        if info.dtype != want:
            raise CheckpointError(f"{key}: expected {want} (FP8 weight of scheme {mod.scheme.name}), got {info.dtype} in {fname}")
        exp = (mod.out_features, mod.in_features)
    elif pname in ("weight_scale", "input_scale"):
        _check_float(key, info, SCALE_ST_DTYPES, "a float scale")
        exp = tuple(getattr(mod, pname).shape)
        # accepted spellings of the same scale: scalar [] or [1, 1] for [1]; [out] for [out, 1]
        same = info.shape == exp or (math.prod(info.shape) == math.prod(exp) and (
            exp == (1,) or (len(exp) == 2 and exp[1] == 1 and info.shape == exp[:1])))
        if not same:
            raise CheckpointError(
                f"{key}: expected shape {list(exp)} ({mod.scheme.weight_granularity if pname == 'weight_scale' else 'static'}"
                f" scale of scheme {mod.scheme.name}), got {list(info.shape)} in {fname}")
        return exp
    else:  # bias
        _check_float(key, info, FLOAT_ST_DTYPES, "a float bias")
        exp = (mod.out_features,)
    if info.shape != exp:
        raise CheckpointError(f"{key}: expected shape {list(exp)}, got {list(info.shape)} in {fname}")
    return exp


def _plain_expectation(key: str, info: TensorInfo, ref: torch.Tensor, ignored_linear: bool) -> None:
    fname = os.path.basename(info.file)
    if info.dtype in FP8_ST_DTYPES.values():
        why = " (the quantization config leaves this Linear unquantized)" if ignored_linear else ""
        raise CheckpointError(f"{key}: expected a non-FP8 tensor{why}, got {info.dtype} in {fname}")
    if ref.dtype.is_floating_point:
        _check_float(key, info, FLOAT_ST_DTYPES, "a float tensor")
    elif info.dtype != ST_DTYPE_OF.get(ref.dtype):
        raise CheckpointError(f"{key}: expected {ST_DTYPE_OF.get(ref.dtype, ref.dtype)}, got {info.dtype} in {fname}")
    if info.shape != tuple(ref.shape):
        raise CheckpointError(f"{key}: expected shape {list(ref.shape)}, got {list(info.shape)} in {fname}")


def _plan_reads(model, plan, swapped, stored: dict[str, TensorInfo]):
    """Check every stored header against the model; ``(reads, zero_checks, alias_groups)``.

    ``reads``: ``{model_name: (stored_key, target_shape)}`` for one name per tied group;
    ``zero_checks``: stored zero-point keys that must hold zeros.
    """
    entries, alias_groups = _state_entries(model)
    skippable = _skippable(model)
    prefix = getattr(model, "base_model_prefix", "") or ""
    mapper = _key_mapper(set(stored), set(entries) | {k for k in stored if _split(k)[0] in swapped}, prefix)
    ignored_linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    reads, zero_checks = {}, []
    for skey in sorted(stored):
        info, mkey = stored[skey], mapper(skey)
        owner, suffix = _split(mkey)
        if owner in swapped:
            mod = swapped[owner]
            if suffix in plan.zero_points:
                zero_checks.append(skey)
                continue
            pname = plan.fp8_name(suffix)
            mkey = f"{owner}.{pname}"
            if mkey not in entries:
                raise CheckpointError(
                    f"{skey}: unexpected tensor in {os.path.basename(info.file)} (module {owner} is FP8 with scheme "
                    f"{mod.scheme.name}: weight, weight_scale{', input_scale' if mod.scheme.static else ''}"
                    f"{', bias' if mod.bias is not None else ''})")
            reads[mkey] = (skey, _fp8_expectation(skey, info, mod, pname))
            continue
        if mkey not in entries and skippable(mkey):
            continue
        if mkey not in entries:
            why = (f"the quantization config leaves Linear {owner} unquantized" if owner in ignored_linears
                   else "the model has no such parameter or buffer")
            raise CheckpointError(f"{skey}: unexpected tensor in {os.path.basename(info.file)} ({why})")
        _plain_expectation(skey, info, entries[mkey], owner in ignored_linears)
        reads[mkey] = (skey, tuple(info.shape))
    for group in alias_groups:
        present = [n for n in group if n in reads]
        if not present:
            raise CheckpointError(f"{group[0]}: missing from the checkpoint (expected shape {list(entries[group[0]].shape)})")
        for extra in present[1:]:
            del reads[extra]
    return reads, zero_checks, alias_groups


def _split(key: str) -> tuple[str, str]:
    owner, _, suffix = key.rpartition(".")
    return owner, suffix


def _assign(model: nn.Module, name: str, value: torch.Tensor) -> None:
    owner, attr = _split(name)
    mod = model.get_submodule(owner) if owner else model
    if attr in mod._parameters:
        mod._parameters[attr] = nn.Parameter(value, requires_grad=False)
    else:
        mod._buffers[attr] = value


def _read(f, key: str, info: TensorInfo, dtype: torch.dtype | None) -> torch.Tensor:
    """Tensor ``key`` of the open safetensors file ``f``, a float one converted to ``dtype`` (``None``: as stored).

    One tensor at a time: the transient copy is one tensor, never the model (converting in row
    chunks through ``get_slice`` measured more peak RSS on SmolLM2, 238 vs 205 MB)."""
    t = f.get_tensor(key)
    if dtype is not None and info.dtype in FLOAT_ST_DTYPES and t.dtype != dtype:
        t = t.to(dtype)
    return t


def _materialize(folder: CheckpointFolder, model, swapped, stored, reads, zero_checks, dtype, device) -> None:
    from safetensors import safe_open

    by_file: dict[str, list[tuple[str, str, tuple]]] = {}
    for mkey, (skey, shape) in reads.items():
        by_file.setdefault(stored[skey].name, []).append((mkey, skey, shape))
    for skey in zero_checks:
        by_file.setdefault(stored[skey].name, []).append((None, skey, None))
    for name, items in by_file.items():
        try:
            with safe_open(folder.path_of(name), framework="pt", device=str(device)) as f:
                for mkey, skey, shape in items:
                    info = stored[skey]
                    owner, pname = _split(mkey) if mkey is not None else ("", "")
                    fp8 = owner in swapped and pname in ("weight",) + SCALE_NAMES
                    t = _read(f, skey, info, None if fp8 else dtype)
                    if mkey is None:
                        if t.float().abs().max().item() != 0:
                            raise CheckpointError(f"{skey}: expected all-zero (symmetric) zero points, got non-zero values")
                        continue
                    if fp8 and pname in SCALE_NAMES:
                        check_scale(owner, pname, t, info, swapped[owner].scheme.fmt)
                        t = t.to(SCALE_DTYPE).reshape(shape)
                    elif fp8:
                        check_fp8_weight(skey, t, info, swapped[owner].scheme.fmt)
                    _assign(model, mkey, t)
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types for corrupt data
            raise CheckpointError(f"{folder.display(name)}: cannot read tensors ({type(e).__name__}: {e})") from e


def _retie(model: nn.Module, alias_groups: list[list[str]]) -> None:
    for group in alias_groups:
        src = next(model.get_parameter(n) for n in group if model.get_parameter(n).device.type != "meta")
        for n in group:
            owner, attr = _split(n)
            (model.get_submodule(owner) if owner else model)._parameters[attr] = src


def _check_dtype(dtype) -> None:
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype in FORMATS.values()):
        raise TypeError(f"dtype: expected a float dtype (torch.bfloat16/float16/float32) or None, got {dtype!r}")


def _place(model: nn.Module, placement: Placement) -> nn.Module:
    if not placement.dispatch:
        return model.to(placement.device)  # buffers built on CPU follow the tensors
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    dmap = placement.device_map
    if dmap is None:
        no_split = list(getattr(model, "_no_split_modules", None) or [])
        max_memory = None
        if placement.strategy != "sequential":
            max_memory = get_balanced_memory(model, no_split_module_classes=no_split,
                                             low_zero=placement.strategy == "balanced_low_0")
        dmap = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)
    return dispatch_model(model, dmap)


def _load(folder: CheckpointFolder, placement: Placement, dtype: torch.dtype | None) -> nn.Module:
    if folder.exists(INCOMPLETE_MARKER):
        raise CheckpointError(f"{folder.display(INCOMPLETE_MARKER)}: the save into {folder.path!r} never finished")
    plan, qc = read_plan(folder)
    for note in plan.notes:
        log.warning(note)
    stored = list_tensors(folder)
    cfg = folder.read_json(CONFIG_FILE)
    config, cls = build_config(cfg, folder.display(CONFIG_FILE), max_layers=len(stored))
    model = build_empty_model(config, cls, dtype, folder.display(CONFIG_FILE))
    if "quantization_config" in cfg:
        model.config.quantization_config = cfg["quantization_config"]
    model.config._name_or_path = folder.path
    swapped = _swap_linears(model, plan, dtype)
    swap_embeddings(model, qc, swapped, dtype)  # FP8 input embeddings our extras list (checked as FP8 weights)
    from .experts import ExpertsLoad  # fused MoE experts, stored per expert (no-op without them)

    experts = ExpertsLoad(model, plan, stored, dtype)  # takes their tensors out of ``stored``
    reads, zero_checks, alias_groups = _plan_reads(model, plan, swapped, stored)
    _materialize(folder, model, swapped, stored, reads, zero_checks, dtype, placement.device)
    _retie(model, alias_groups)
    experts.materialize(folder, placement.device)
    for name, mod in swapped.items():
        try:
            mod.check()
        except (FP8LinearError, TypeError, ValueError) as e:
            raise CheckpointError(f"{name}: {e}") from e
    return model


def load_quantized(path: str | os.PathLike, device_map=None, dtype: torch.dtype | None = torch.bfloat16) -> nn.Module:
    """Load an FP8 checkpoint folder into a model whose quantized Linear layers are :class:`FP8Linear`.

    The folder is untrusted input (docs/checkpoints.md): every config field read is type- and
    range-checked, every safetensors header before any tensor, files outside the folder are never
    read, regex patterns run with a time bound, and FP8 weights holding NaN / inf bytes or scales
    that are not finite, positive and representable in fp32 are refused. Files are read through one
    open handle of the folder, so a save replacing the checkpoint meanwhile cannot mix two versions.

    Args:
        path: folder with ``config.json`` and ``model.safetensors`` (or shards plus
            ``model.safetensors.index.json``), written by :func:`save_quantized`, llm-compressor
            (compressed-tensors), vLLM / AutoFP8 / transformers ``FineGrainedFP8Config`` (``fp8``),
            transformers ``fbgemm_fp8`` or NVIDIA ModelOpt (see ``readers.py``).
        device_map: ``None`` / ``"cpu"`` / ``"cuda:0"`` / a ``torch.device`` / a CUDA index (tensors are
            read straight onto it), or ``"auto"`` / ``"balanced"`` / ``"balanced_low_0"`` /
            ``"sequential"`` / an accelerate device map dict (dispatched after loading on CPU).
        dtype: dtype of the non-quantized tensors (embeddings, norms, biases, ignored Linear layers);
            ``None`` keeps the stored dtypes. FP8 weights stay FP8 ``[out, in]``; scales are fp32.

    Returns:
        the model (``eval()`` mode), its ``config.quantization_config`` the stored dict.

    Raises:
        CheckpointError: naming the tensor, file or config field, for anything wrong with the folder:
            a missing / extra / mis-shaped / wrongly typed tensor, a truncated or inconsistent
            safetensors file, a malformed config, an unknown ``quant_method``, a config that disagrees
            with the tensors, invalid values, or an unfinished save. Nothing else escapes a load.
        DeviceError: ``device_map`` names no device this machine has (e.g. ``"cuda"`` without CUDA).
        TypeError: ``dtype`` is not a float dtype.
    """
    folder = folder_path(path)
    _check_dtype(dtype)
    placement = resolve_device_map(device_map)
    if not os.path.isdir(folder):
        raise CheckpointError(f"path: expected a checkpoint folder, got {folder!r} (not a directory){interrupted_save_hint(folder)}")
    with CheckpointFolder(folder) as opened:
        try:
            model = _load(opened, placement, dtype)
        except CheckpointError as e:
            if opened.replaced():
                raise CheckpointError(f"{folder}: replaced by a concurrent save during the load ({e}); load it again") from e
            raise
        except Exception as e:  # the contract: a bad checkpoint ends in a CheckpointError, never in another error
            raise CheckpointError(f"{folder}: cannot load ({type(e).__name__}: {str(e)[:300]})") from e
        try:
            model = _place(model, placement)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:  # accelerate refusing the map, device memory
            raise DeviceError(f"device_map: cannot place the model with {device_map!r:.100} ({type(e).__name__}: "
                              f"{str(e)[:300]})") from e
        if opened.replaced() and not opened.snapshot:
            raise CheckpointError(f"{folder}: replaced by a concurrent save during the load; load it again")
        if opened.replaced():
            log.warning("%s was replaced by a save while loading; the model is the checkpoint as it was when the load "
                        "began (all of its files were read from that version)", folder)
    return model
