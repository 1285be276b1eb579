"""Calibration: observers, the calibration loop, quantize_model, evaluation.

Installed as ``fp8_linear.calibration``. Public entry points: :func:`quantize_model` and
:func:`compare_schemes` (also re-exported lazily from ``fp8_linear``).
"""

from .quantize import apply_quantization, calibrate, quantize_model, select_linears


def __getattr__(name):
    # compare pulls in evaluation and matplotlib; import it on first use only.
    if name == "compare_schemes":
        from .compare import compare_schemes

        return compare_schemes
    raise AttributeError(f"module 'fp8_linear.calibration' has no attribute {name!r}")


__all__ = ["quantize_model", "compare_schemes", "calibrate", "apply_quantization", "select_linears"]
