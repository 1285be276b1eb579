"""fp8-linear: FP8 inference for Hugging Face models.

Public API (docs/design.md section 3)::

    fp8_gemm(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16)
    quantize_fp8(x, fmt="e4m3", granularity="tensor", scale=None, rounding="nearest")
    FP8Linear, FP8Linear.from_linear(linear, scheme, input_amax=None)
    FP8Embedding.from_embedding(embedding)  # e4m3 table, one scale per row (quantize_model(quantize_embeddings=True))
    grouped_fp8_gemm(a, b, scale_a, scale_b, offsets, bias=None, out_dtype=torch.bfloat16)  # MoE experts
    FP8Experts.from_experts(experts, scheme, input_amax=None)  # transformers' fused experts (docs/moe.md)
    fuse_projections(model) -> FusionReport / unfuse_projections(model)  # q/k/v, gate/up as one GEMM (docs/serving.md)
    QuantScheme, PRESETS
    quantize_model(model, calib_data, scheme="fp8-channel", ...)
    save_quantized(model, path, tokenizer=None) / load_quantized(path, device_map=None, dtype=torch.bfloat16)
    compare_schemes(model, eval_data, schemes=(...), calib_data=...)
    FP8LinearConfig(scheme="fp8-dynamic", ignore=("lm_head",), fmt="e4m3", backend=None)
        # transformers: from_pretrained(path, quantization_config=FP8LinearConfig(...)) quantizes on load
"""

from __future__ import annotations

from .errors import (
    BackendUnavailableError,
    CalibrationError,
    CheckpointError,
    DeviceError,
    FP8LinearError,
    ScaleError,
    ShapeError,
)
from .formats import FORMATS, fmt_max
from .gemm import fp8_gemm
from .grouped_gemm import grouped_fp8_gemm
from .module import FP8Linear
from .embedding import FP8Embedding
from .fusion import FusionError, FusionReport, fuse_projections, unfuse_projections
from .quantize import dequantize_fp8, quantize_fp8
from .scheme import PRESETS, QuantScheme, resolve_scheme
from .integrations import install as _install_integrations

__version__ = "0.1.0"

# quant_method "fp8_linear" in transformers' registry, without importing transformers now.
_install_integrations()


def __getattr__(name):
    # Lazy re-exports: calibration and checkpoints pull in transformers, which is slow to import.
    if name in ("quantize_model", "compare_schemes"):
        from . import calibration

        return getattr(calibration, name)
    if name in ("save_quantized", "load_quantized"):
        from . import checkpoint

        return getattr(checkpoint, name)
    if name == "FP8Experts":  # imports transformers' experts interface
        from .moe.experts import FP8Experts

        return FP8Experts
    if name == "FP8LinearConfig":
        from .integrations.transformers_config import FP8LinearConfig

        return FP8LinearConfig
    raise AttributeError(f"module 'fp8_linear' has no attribute {name!r}")


__all__ = [
    "BackendUnavailableError", "CalibrationError", "CheckpointError", "DeviceError", "FP8LinearError", "ScaleError", "ShapeError",
    "FORMATS", "fmt_max", "fp8_gemm", "FP8Linear", "FP8Embedding", "dequantize_fp8", "quantize_fp8", "PRESETS", "QuantScheme",
    "resolve_scheme", "quantize_model", "compare_schemes", "save_quantized", "load_quantized",
    "FP8LinearConfig", "grouped_fp8_gemm", "FP8Experts", "FusionError", "FusionReport", "fuse_projections",
    "unfuse_projections",
]
