"""Replacing a model's decoder linear layers by FP8 layers of one preset (or torchao's float8) and back.

A benchmark keeps the BF16 ``nn.Linear`` layers (:func:`decoder_linears`), calibrates the static presets'
input scales once (:func:`calibrate`), swaps :func:`fp8_layers` in for a path and the BF16 layers back
after it (:func:`swap_in`); :func:`forced_backend` pins ``FP8_LINEAR_BACKEND`` for the block. The
embeddings, norms and ``lm_head`` stay BF16.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from fp8_linear import FP8Linear, settings


def decoder_linears(model: nn.Module) -> dict[str, nn.Module]:
    """The decoder's linear layers (``nn.Linear`` or ``FP8Linear``) by qualified name, ``lm_head``
    excluded, in module order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, (nn.Linear, FP8Linear)) and "lm_head" not in n}


def calibrate(model: nn.Module, tokens: int = 512) -> dict[str, float]:
    """Input amax of each decoder linear (by name) over one forward of ``[1, tokens]`` random token ids
    on the model's device (what the static presets' input scales are made from)."""
    amax: dict[str, float] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, a, n=n: amax.__setitem__(n, max(amax.get(n, 0.0), float(a[0].abs().amax()))))
             for n, m in decoder_linears(model).items()]
    device = next(model.parameters()).device
    try:
        with torch.inference_mode():
            model(torch.randint(0, model.config.vocab_size, (1, tokens), device=device))
    finally:
        for h in hooks:
            h.remove()
    return amax


def swap_in(model: nn.Module, modules: dict[str, nn.Module]) -> None:
    """Set each ``model.<name>`` to ``modules[name]`` (qualified names, as :func:`decoder_linears` gives)."""
    for name, mod in modules.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, mod)


def fp8_layers(bf16: dict[str, nn.Linear], preset: str, amax: dict[str, float]) -> dict[str, FP8Linear]:
    """``FP8Linear.from_linear`` of every layer of ``bf16`` with ``preset``, the static input scale made from
    ``amax[name]`` (ignored by dynamic presets); ``KeyError`` for a layer without an amax."""
    return {n: FP8Linear.from_linear(lin, preset, input_amax=amax[n]) for n, lin in bf16.items()}


@contextlib.contextmanager
def forced_backend(name: str | None):
    """``FP8_LINEAR_BACKEND=name`` for the block (``None``: the default choice), settings re-read on entry
    and exit (the variable's previous value restored)."""
    old = os.environ.get(settings.BACKEND_ENV)
    if name:
        os.environ[settings.BACKEND_ENV] = name
    else:
        os.environ.pop(settings.BACKEND_ENV, None)
    settings.reload()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(settings.BACKEND_ENV, None)
        else:
            os.environ[settings.BACKEND_ENV] = old
        settings.reload()


def torchao_layers(model: nn.Module) -> str | None:
    """Quantize ``model``'s decoder linears in place with torchao float8 (``Float8DynamicActivationFloat8WeightConfig
    (granularity=PerRow())``: dynamic per-row activations and weights); ``None`` on success, else the reason
    it cannot (torchao absent or too old, no FP8 GPU)."""
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except Exception as e:  # noqa: BLE001 - torchao absent or too old
        return (f"torchao not importable ({type(e).__name__}: {e}); install the wheel first: "
                f"pip install --no-deps .whl/torchao-*.whl")
    try:
        quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
                  filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
    except Exception as e:  # noqa: BLE001 - e.g. no FP8 GPU
        return f"torchao float8 could not quantize the model ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    return None
