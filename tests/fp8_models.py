"""FP8 versions of transformers models for the tests of the serving paths (import as
``from fp8_models import swap_in_fp8``; ``tests/`` is on sys.path)."""

from __future__ import annotations

import torch
from torch import nn

from fp8_linear import FP8Linear


def swap_in_fp8(model: nn.Module, ids: torch.Tensor, preset: str, margin: float = 1.0) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` but ``lm_head``, in place, by ``FP8Linear.from_linear``
    with ``preset``; static presets get each layer's input amax over one forward of ``ids`` (token ids
    ``[B, T]``) times ``margin`` (room for tokens generated past the prompt's range). Returns ``model``."""
    lins = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"}
    amax: dict[str, float] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, a, n=n: amax.__setitem__(n, max(amax.get(n, 0.0), float(a[0].abs().max()))))
             for n, m in lins.items()]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    for n, lin in lins.items():
        parent, _, child = n.rpartition(".")
        setattr(model.get_submodule(parent), child, FP8Linear.from_linear(lin, preset, input_amax=amax[n] * margin))
    return model
