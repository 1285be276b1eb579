"""compressed-tensors ``quantization_config`` <-> :class:`QuantScheme` (the format we save).

Field names follow what compressed-tensors itself writes (``QuantizationConfig`` /
``QuantizationArgs``, presets ``FP8``, ``FP8_DYNAMIC``, ``FP8_BLOCK``)::

    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "quantization_status": "compressed", "ignore": ["lm_head"],
     "config_groups": {"group_0": {"targets": ["Linear"], "format": "float-quantized",
         "weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel",
                     "group_size": null, "dynamic": false},
         "input_activations": {..., "strategy": "token", "dynamic": true}}}}

Our own extras (the exact scheme of each group: preset name, FP8 format, observers) live under
the namespaced key :data:`EXTRAS_KEY`, which compressed-tensors ignores.
"""

from __future__ import annotations

from dataclasses import asdict, fields

from ..errors import CheckpointError
from ..formats import GROUP_SIZE
from ..scheme import PRESETS, QuantScheme
from .fields import fail, is_int
from .plan import QuantPlan, check_patterns

CT_METHOD = "compressed-tensors"
CT_FORMAT = "float-quantized"
CT_STATUS = "compressed"
EXTRAS_KEY = "fp8_linear"
FP8_BITS = 8
BLOCK_STRUCTURE = [GROUP_SIZE, GROUP_SIZE]
#: compressed-tensors zero-point tensors: symmetric FP8 writes none, older versions wrote zeros.
CT_ZERO_POINTS = ("weight_zero_point", "input_zero_point")


def _args(strategy: str, dynamic: bool, group_size: int | None = None) -> dict:
    args = {
        "num_bits": FP8_BITS, "type": "float", "symmetric": True, "group_size": group_size,
        "strategy": strategy, "dynamic": dynamic,
    }
    if strategy == "block":
        args["block_structure"] = list(BLOCK_STRUCTURE)
    return args


def scheme_to_group(scheme: QuantScheme, targets: list[str]) -> dict:
    """One ``config_groups`` entry for modules quantized with ``scheme``."""
    if scheme.activation_dynamic:
        gran = scheme.activation_granularity
        inputs = _args(gran, True, GROUP_SIZE if gran == "group" else None)
    else:
        inputs = _args("tensor", False)
    return {
        "targets": list(targets), "format": CT_FORMAT,
        "weights": _args(scheme.weight_granularity, False), "input_activations": inputs,
        "output_activations": None,
    }


def build_ct_config(groups: list[tuple[list[str], QuantScheme]], ignore: list[str], version: str) -> dict:
    """The full ``quantization_config`` dict for ``groups`` of ``(targets, scheme)`` and ``ignore``."""
    config_groups, extras = {}, {}
    for i, (targets, scheme) in enumerate(groups):
        config_groups[f"group_{i}"] = scheme_to_group(scheme, targets)
        extras[f"group_{i}"] = asdict(scheme)
    return {
        "quant_method": CT_METHOD, "format": CT_FORMAT, "quantization_status": CT_STATUS,
        "config_groups": config_groups, "ignore": list(ignore), "kv_cache_scheme": None,
        "global_compression_ratio": None, EXTRAS_KEY: {"version": version, "schemes": extras},
    }


def _fail(where: str, expected: str, got) -> CheckpointError:
    return fail(f"config.json quantization_config.{where}", expected, got)


def _check_fp8_args(args, where: str) -> dict:
    if not isinstance(args, dict):
        raise _fail(where, "a dict of quantization args", args)
    kind, bits = args.get("type"), args.get("num_bits")
    if kind != "float" or not is_int(bits) or bits != FP8_BITS:
        raise _fail(f"{where}.type/num_bits", "float / 8 (FP8)", f"{str(kind)[:40]} / {str(bits)[:40]}")
    if args.get("symmetric", True) is not True:
        raise _fail(f"{where}.symmetric", "true", args.get("symmetric"))
    for key in ("strategy",):
        if not isinstance(args.get(key), (str, type(None))):
            raise _fail(f"{where}.{key}", "a string", args.get(key))
    if not isinstance(args.get("dynamic", False), (bool, type(None))) and args.get("dynamic") != "local":
        raise _fail(f"{where}.dynamic", "true or false", args.get("dynamic"))
    if args.get("group_size") is not None and not is_int(args.get("group_size")):
        raise _fail(f"{where}.group_size", "an integer or null", args.get("group_size"))
    return args


def group_to_scheme(name: str, group: dict) -> QuantScheme:
    """The :class:`QuantScheme` equivalent of one compressed-tensors config group (granularities only)."""
    where = f"config_groups.{name}"
    w = _check_fp8_args(group.get("weights"), f"{where}.weights")
    wstrat = w.get("strategy")
    if w.get("dynamic"):
        raise _fail(f"{where}.weights.dynamic", "false", w.get("dynamic"))
    if wstrat not in ("tensor", "channel", "block"):
        raise _fail(f"{where}.weights.strategy", "tensor, channel or block", wstrat)
    if wstrat == "block" and w.get("block_structure") != BLOCK_STRUCTURE:
        raise _fail(f"{where}.weights.block_structure", str(BLOCK_STRUCTURE), w.get("block_structure"))
    a = group.get("input_activations")
    if a is None:
        raise _fail(f"{where}.input_activations", "FP8 activations (weight-only FP8 is not supported)", None)
    a = _check_fp8_args(a, f"{where}.input_activations")
    astrat, dyn = a.get("strategy"), a.get("dynamic")
    if dyn is False and astrat == "tensor":
        return QuantScheme(f"{CT_METHOD}:{name}", wstrat, False, "tensor")
    if dyn is True and astrat in ("tensor", "token"):
        return QuantScheme(f"{CT_METHOD}:{name}", wstrat, True, astrat)
    if dyn is True and astrat == "group" and a.get("group_size") == GROUP_SIZE:
        return QuantScheme(f"{CT_METHOD}:{name}", wstrat, True, "group")
    raise _fail(f"{where}.input_activations", "static tensor, or dynamic tensor/token/group 128",
                f"dynamic={dyn}, strategy={astrat}, group_size={a.get('group_size')}")


def _same_numerics(a: QuantScheme, b: QuantScheme) -> bool:
    keys = ("weight_granularity", "activation_dynamic", "activation_granularity")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


#: Fields of our extras' scheme entries and their JSON types.
_EXTRAS_FIELDS = {f.name: (bool if f.name == "activation_dynamic" else str) for f in fields(QuantScheme)}


def _named(scheme: QuantScheme, extras, name: str) -> QuantScheme:
    """Our exact scheme from the extras when present and consistent, else a preset twin, else ``scheme``."""
    where = f"{EXTRAS_KEY}.schemes.{name}"
    if extras is not None:
        if not isinstance(extras, dict):
            raise _fail(where, "an object of QuantScheme fields", extras)
        for key, value in extras.items():
            if key not in _EXTRAS_FIELDS or not isinstance(value, _EXTRAS_FIELDS[key]):
                want = _EXTRAS_FIELDS.get(key)
                raise _fail(f"{where}.{key}", f"a {want.__name__} field of QuantScheme" if want else
                            f"one of the QuantScheme fields {sorted(_EXTRAS_FIELDS)}", value if want else key)
        try:
            ours = QuantScheme(**extras)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"config.json quantization_config.{where}: {e}") from e
        if not _same_numerics(ours, scheme):
            raise CheckpointError(
                f"config.json quantization_config.{where}: expected the granularities of "
                f"config_groups.{name} ({scheme.weight_granularity}/{scheme.activation_granularity}, "
                f"dynamic={scheme.activation_dynamic}), got {ours}")
        return ours
    for preset in PRESETS.values():
        if _same_numerics(preset, scheme):
            return preset
    return scheme


def plan_from_ct(qc: dict) -> QuantPlan:
    """:class:`QuantPlan` of a compressed-tensors ``quantization_config`` (ours or llm-compressor's);
    every field read is type-checked (:class:`CheckpointError` naming it)."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _fail("config_groups", "a non-empty dict", groups)
    fmts = [("format", qc.get("format"))] + [(f"config_groups.{n}.format", g.get("format"))
                                             for n, g in groups.items() if isinstance(g, dict)]
    for where, fmt in fmts:
        if fmt is not None and fmt != CT_FORMAT:
            raise _fail(where if where != "format" else "format", f"{CT_FORMAT!r} (FP8 weights)", fmt)
    status = qc.get("quantization_status", CT_STATUS)
    if status != CT_STATUS:
        raise _fail("quantization_status", repr(CT_STATUS), status)
    if qc.get("kv_cache_scheme"):
        raise _fail("kv_cache_scheme", "null (FP8 KV-cache scales are not supported)", qc.get("kv_cache_scheme"))
    ours = qc.get(EXTRAS_KEY) or {}
    if not isinstance(ours, dict) or not isinstance(ours.get("schemes", {}), dict):
        raise _fail(EXTRAS_KEY, "an object with a 'schemes' object", ours)
    extras = ours.get("schemes", {})
    plan_groups = []
    for name, group in groups.items():
        if not isinstance(group, dict) or not group.get("targets"):
            raise _fail(f"config_groups.{name}.targets", "a non-empty list", None if not isinstance(group, dict) else group.get("targets"))
        targets = check_patterns(group["targets"], "ct", f"config.json quantization_config.config_groups.{name}.targets")
        scheme = _named(group_to_scheme(name, group), extras.get(name), name)
        plan_groups.append((targets, scheme))
    ignore = check_patterns(qc.get("ignore"), "ct", "config.json quantization_config.ignore")
    return QuantPlan(CT_METHOD, plan_groups, ignore, "ct", zero_points=CT_ZERO_POINTS)
