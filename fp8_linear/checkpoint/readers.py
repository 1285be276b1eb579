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

import json
import os

from ..errors import CheckpointError
from ..formats import GROUP_SIZE
from ..scheme import QuantScheme
from .ct_config import CT_METHOD, plan_from_ct
from .plan import QuantPlan

CONFIG_FILE = "config.json"
MODELOPT_FILE = "hf_quant_config.json"
SUPPORTED_METHODS = (CT_METHOD, "fp8", "fbgemm_fp8", "modelopt")
FP8_RENAMES = {"weight_scale_inv": "weight_scale", "activation_scale": "input_scale"}
MODELOPT_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")


def read_json(path: str) -> dict:
    """A JSON object from ``path``; :class:`CheckpointError` naming the file when missing or invalid."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: expected a JSON file, got no such file") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: expected valid JSON, got {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _plan_fp8(qc: dict) -> QuantPlan:
    static = str(qc.get("activation_scheme", "dynamic")).lower()
    if static not in ("static", "dynamic"):
        raise CheckpointError(f"config.json quantization_config.activation_scheme: expected 'static' or 'dynamic', got {static!r}")
    if str(qc.get("fmt", "e4m3")).lower() != "e4m3":
        raise CheckpointError(f"config.json quantization_config.fmt: expected 'e4m3', got {qc.get('fmt')!r}")
    if qc.get("scale_fmt", "float") not in ("float", "ue8m0"):
        raise CheckpointError(f"config.json quantization_config.scale_fmt: expected 'float' or 'ue8m0', got {qc.get('scale_fmt')!r}")
    block = qc.get("weight_block_size")
    dynamic = static == "dynamic"
    if block is None:
        scheme = QuantScheme(f"fp8:{static}", "tensor", dynamic, "tensor")
    elif list(block) == [GROUP_SIZE, GROUP_SIZE]:
        scheme = QuantScheme(f"fp8:block-{static}", "block", dynamic, "group" if dynamic else "tensor")
    else:
        raise CheckpointError(
            f"config.json quantization_config.weight_block_size: expected [{GROUP_SIZE}, {GROUP_SIZE}] or null, got {block!r}")
    ignore = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or []
    if qc.get("modules_to_convert"):
        raise CheckpointError(
            f"config.json quantization_config.modules_to_convert: expected null (every Linear not ignored is FP8), "
            f"got {qc['modules_to_convert']!r}")
    return QuantPlan("fp8", [(["Linear"], scheme)], list(ignore), "substring", renames=dict(FP8_RENAMES),
                     keep_output_embeddings=True)


def _plan_fbgemm(qc: dict) -> QuantPlan:
    scheme = QuantScheme("fbgemm_fp8", "channel", True, "token")
    notes = []
    if qc.get("activation_scale_ub") is not None:
        notes.append(f"fbgemm_fp8 activation_scale_ub={qc['activation_scale_ub']} (an upper bound on per-token "
                     "activation scales) is not applied; per-token scales are plain amax / 448")
    return QuantPlan("fbgemm_fp8", [(["Linear"], scheme)], list(qc.get("modules_to_not_convert") or []),
                     "substring", notes=notes, keep_output_embeddings=True)


def _plan_modelopt(q: dict, source: str) -> QuantPlan:
    algo = q.get("quant_algo")
    if algo not in MODELOPT_ALGOS:
        raise CheckpointError(f"{source} quant_algo: expected one of {list(MODELOPT_ALGOS)}, got {algo!r}")
    if q.get("kv_cache_quant_algo"):
        raise CheckpointError(f"{source} kv_cache_quant_algo: expected null (FP8 KV-cache is not supported), got {q['kv_cache_quant_algo']!r}")
    scheme = (QuantScheme("modelopt:FP8", "tensor", False, "tensor") if algo == "FP8"
              else QuantScheme("modelopt:FP8_PER_CHANNEL_PER_TOKEN", "channel", True, "token"))
    ignore = q.get("exclude_modules") or q.get("ignore") or []
    return QuantPlan("modelopt", [(["*"], scheme)], list(ignore), "glob")


def read_plan(folder: str) -> tuple[QuantPlan, dict]:
    """``(plan, quantization_config)`` of the checkpoint in ``folder`` (``config.json``, or ModelOpt's
    ``hf_quant_config.json``); :class:`CheckpointError` for an unknown or unsupported ``quant_method``."""
    cfg = read_json(os.path.join(folder, CONFIG_FILE))
    qc = cfg.get("quantization_config")
    if qc is None and os.path.exists(os.path.join(folder, MODELOPT_FILE)):
        hq = read_json(os.path.join(folder, MODELOPT_FILE))
        q = hq.get("quantization")
        if not isinstance(q, dict):
            raise CheckpointError(f"{os.path.join(folder, MODELOPT_FILE)}: expected a 'quantization' object, got {q!r}")
        return _plan_modelopt(q, MODELOPT_FILE), dict(q, quant_method="modelopt")
    if not isinstance(qc, dict):
        raise CheckpointError(
            f"{os.path.join(folder, CONFIG_FILE)}: expected a quantization_config (FP8 checkpoint), got {qc!r}")
    method = qc.get("quant_method")
    if method == CT_METHOD:
        return plan_from_ct(qc), qc
    if method == "fp8":
        return _plan_fp8(qc), qc
    if method == "fbgemm_fp8":
        return _plan_fbgemm(qc), qc
    if method == "modelopt":
        return _plan_modelopt(qc, "config.json quantization_config"), qc
    raise CheckpointError(
        f"config.json quantization_config.quant_method: expected one of {list(SUPPORTED_METHODS)}, got {method!r}")
