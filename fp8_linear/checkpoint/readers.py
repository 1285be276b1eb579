"""Read a checkpoint folder's quantization config into a :class:`QuantPlan`, whatever wrote it.

=================== ====================================== ==========================================
``quant_method``    writers                                 mapped to (weights / activations)
=================== ====================================== ==========================================
compressed-tensors  fp8-linear, llm-compressor              per the config groups (``ct_config.py``)
fp8                 vLLM / AutoFP8, transformers             tensor / static or dynamic per-tensor;
                    ``FineGrainedFP8Config``, DeepSeek-V3    ``weight_block_size`` [128,128]: block /
                                                             dynamic 1x128 groups (or static tensor)
fbgemm_fp8          transformers ``FbgemmFp8Config``         channel ``[out, 1]`` / dynamic per-token
modelopt            NVIDIA ModelOpt (``hf_quant_config``)    ``FP8``: tensor / static tensor;
                                                             ``FP8_PER_CHANNEL_PER_TOKEN``: channel / token
=================== ====================================== ==========================================

Tensor names: ``weight_scale_inv`` (fp8 block and FineGrainedFP8) is the multiplier
``W ~= weight * weight_scale_inv``, i.e. our ``weight_scale``; ``activation_scale``
(FineGrainedFP8 static) is our ``input_scale``. Scalar ``[]`` scales read as ``[1]``.
"""

from __future__ import annotations

from ..errors import CheckpointError
from ..formats import GROUP_SIZE
from ..scheme import QuantScheme
from .ct_config import CT_METHOD, plan_from_ct
from .fields import fail, get_int_list, get_number, get_str
from .folder import CheckpointFolder
from .plan import QuantPlan, check_patterns

CONFIG_FILE = "config.json"
MODELOPT_FILE = "hf_quant_config.json"
SUPPORTED_METHODS = (CT_METHOD, "fp8", "fbgemm_fp8", "modelopt")
FP8_RENAMES = {"weight_scale_inv": "weight_scale", "activation_scale": "input_scale"}
MODELOPT_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")
QC = "config.json quantization_config"


def read_json(path: str) -> dict:
    """A JSON object from file ``path``; :class:`CheckpointError` naming the file when missing or invalid."""
    import os

    with CheckpointFolder(os.path.dirname(os.path.abspath(path)) or ".") as folder:
        return folder.read_json(os.path.basename(path))


def _ignore(qc: dict, keys: tuple[str, ...], style: str, where: str) -> list[str]:
    """The first non-empty of ``keys`` as a checked pattern list (``[]`` when none is set); every
    one present is checked."""
    lists = [check_patterns(qc.get(key), style, f"{where}.{key}") for key in keys]
    return next((x for x in lists if x), [])


def _plan_fp8(qc: dict) -> QuantPlan:
    static = get_str(qc, "activation_scheme", QC, ("static", "dynamic"), "dynamic", lower=True)
    get_str(qc, "fmt", QC, ("e4m3",), lower=True)
    get_str(qc, "scale_fmt", QC, ("float", "ue8m0"))
    block = get_int_list(qc, "weight_block_size", QC)
    dynamic = static == "dynamic"
    if block is None:
        scheme = QuantScheme(f"fp8:{static}", "tensor", dynamic, "tensor")
    elif block == [GROUP_SIZE, GROUP_SIZE]:
        scheme = QuantScheme(f"fp8:block-{static}", "block", dynamic, "group" if dynamic else "tensor")
    else:
        raise fail(f"{QC}.weight_block_size", f"[{GROUP_SIZE}, {GROUP_SIZE}] or null", block)
    ignore = _ignore(qc, ("ignored_layers", "modules_to_not_convert"), "substring", QC)
    if qc.get("modules_to_convert"):
        raise fail(f"{QC}.modules_to_convert", "null (every Linear not ignored is FP8)", qc["modules_to_convert"])
    return QuantPlan("fp8", [(["Linear"], scheme)], ignore, "substring", renames=dict(FP8_RENAMES),
                     keep_output_embeddings=True)


def _plan_fbgemm(qc: dict) -> QuantPlan:
    scheme = QuantScheme("fbgemm_fp8", "channel", True, "token")
    notes = []
    ub = get_number(qc, "activation_scale_ub", QC, positive=True)
    if ub is not None:
        notes.append(f"fbgemm_fp8 activation_scale_ub={ub} (an upper bound on per-token "
                     "activation scales) is not applied; per-token scales are plain amax / 448")
    ignore = _ignore(qc, ("modules_to_not_convert",), "substring", QC)
    return QuantPlan("fbgemm_fp8", [(["Linear"], scheme)], ignore, "substring", notes=notes, keep_output_embeddings=True)


def _plan_modelopt(q: dict, source: str) -> QuantPlan:
    algo = q.get("quant_algo")
    if not isinstance(algo, str) or algo not in MODELOPT_ALGOS:
        raise CheckpointError(f"{source} quant_algo: expected one of {list(MODELOPT_ALGOS)}, got {algo!r:.200}")
    if q.get("kv_cache_quant_algo"):
        raise CheckpointError(f"{source} kv_cache_quant_algo: expected null (FP8 KV-cache is not supported), "
                              f"got {q['kv_cache_quant_algo']!r:.200}")
    scheme = (QuantScheme("modelopt:FP8", "tensor", False, "tensor") if algo == "FP8"
              else QuantScheme("modelopt:FP8_PER_CHANNEL_PER_TOKEN", "channel", True, "token"))
    ignore = _ignore(q, ("exclude_modules", "ignore"), "glob", source)
    return QuantPlan("modelopt", [(["*"], scheme)], ignore, "glob")


def read_plan(folder: str | CheckpointFolder) -> tuple[QuantPlan, dict]:
    """``(plan, quantization_config)`` of the checkpoint in ``folder`` (``config.json``, or ModelOpt's
    ``hf_quant_config.json``); :class:`CheckpointError` for an unknown or unsupported ``quant_method``,
    or any field of the wrong type, range or choice (named)."""
    if not isinstance(folder, CheckpointFolder):
        with CheckpointFolder(folder) as opened:
            return read_plan(opened)
    cfg = folder.read_json(CONFIG_FILE)
    qc = cfg.get("quantization_config")
    if qc is None and folder.exists(MODELOPT_FILE):
        hq = folder.read_json(MODELOPT_FILE)
        q = hq.get("quantization")
        if not isinstance(q, dict):
            raise CheckpointError(f"{folder.display(MODELOPT_FILE)}: expected a 'quantization' object, got {q!r:.200}")
        return _plan_modelopt(q, MODELOPT_FILE), dict(q, quant_method="modelopt")
    if not isinstance(qc, dict):
        raise CheckpointError(
            f"{folder.display(CONFIG_FILE)}: expected a quantization_config (FP8 checkpoint), got {qc!r:.200}")
    method = qc.get("quant_method")
    if method == CT_METHOD:
        return plan_from_ct(qc), qc
    if method == "fp8":
        return _plan_fp8(qc), qc
    if method == "fbgemm_fp8":
        return _plan_fbgemm(qc), qc
    if method == "modelopt":
        return _plan_modelopt(qc, QC), qc
    raise CheckpointError(f"{QC}.quant_method: expected one of {list(SUPPORTED_METHODS)}, got {method!r:.200}")
