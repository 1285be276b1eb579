"""Typed errors of fp8-linear.

Every public entry point validates its inputs and raises one of these (or a plain
``ValueError`` / ``TypeError``, which the classes below also derive from where it fits),
with a message naming the argument, the expected and the actual value.
"""

from __future__ import annotations


class FP8LinearError(Exception):
    """Base class of every error raised by fp8-linear itself."""


class ScaleError(FP8LinearError, ValueError):
    """A scale tensor has the wrong shape, dtype, or a NaN / inf / zero / negative value."""


class ShapeError(FP8LinearError, ValueError):
    """Tensor shapes of a GEMM or a module disagree."""


class BackendUnavailableError(FP8LinearError, RuntimeError):
    """No GEMM backend (or the forced one) can run the problem; the message lists every reason."""


class CheckpointError(FP8LinearError, ValueError):
    """A checkpoint is missing, corrupt, or does not match its model; the message names the tensor or file."""


class CalibrationError(FP8LinearError, ValueError):
    """Calibration data is empty, all padding, or produced NaN/inf activations (the layer is named)."""


class DeviceError(FP8LinearError, ValueError):
    """A device argument names a device that torch does not know or this machine does not have."""
