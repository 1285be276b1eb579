"""Bytes of a model's weights, tensor subclasses (torchao's float8 weights) counted by their inner tensors."""

from __future__ import annotations

import torch
from torch import nn


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes held by ``t`` (``numel * element_size``); a tensor subclass by the sum over its inner tensors
    (``__tensor_flatten__``), so an FP8 weight with its scale counts both."""
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def weight_bytes(modules) -> int:
    """Bytes of every parameter and buffer of the given modules (an iterable of ``nn.Module``; each
    module's submodules included)."""
    return sum(tensor_bytes(t) for m in modules for t in [*m.parameters(), *m.buffers()])
