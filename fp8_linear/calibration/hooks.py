"""Forward pre-hooks that fold each target layer's input into its observer (and its ``H`` for GPTQ).

Shared by the all-at-once calibration (:func:`~fp8_linear.calibration.quantize.calibrate`) and the
layer-by-layer one (:mod:`~fp8_linear.calibration.layerwise`), so both observe exactly the same rows.
"""

from __future__ import annotations

import torch
from torch import nn

from .gptq import HessianAccumulator, check_token_cap
from .observers import ActivationObserver


class ObserverHooks:
    """Observe the inputs of ``modules`` (name -> module) into ``observers`` (name -> observer).

    Per batch, call :meth:`begin_batch` with the flattened attention mask first: padding rows
    (``mask == False``) never reach an observer. With ``hessian``, consecutive targets fed the very
    same input tensor (q/k/v, gate/up) share one :class:`HessianAccumulator` (created on the
    input's device, every token or at most ``hessian_tokens``, a positive int; else ``ValueError``).
    """

    def __init__(self, observers: dict[str, ActivationObserver], hessian: bool = False, hessian_tokens: int | None = None):
        check_token_cap(hessian_tokens, "hessian_tokens")
        self.observers = observers
        self.hessian = hessian
        self.hessian_tokens = hessian_tokens
        self.mask: torch.Tensor | None = None
        self.last: tuple = (None, None)
        self.handles: list = []

    def begin_batch(self, mask: torch.Tensor | None) -> None:
        """``mask``: bool ``[B * T]`` on the activations' device, or ``None`` when there is no padding."""
        self.mask, self.last = mask, (None, None)

    def _hook(self, name: str):
        def hook(_mod, args, kwargs):
            x0 = args[0] if args else next(iter(kwargs.values()))
            x, mask = x0, self.mask
            if mask is not None and x.dim() >= 2 and x.shape[:-1].numel() == mask.numel():
                x = x.reshape(-1, x.shape[-1])[mask]
            o = self.observers[name]
            o.update(x)
            if self.hessian:
                last_x, last_h = self.last
                if getattr(o, "hessian", None) is None:  # consecutive layers fed the same tensor share one H
                    o.hessian = last_h if last_x is x0 else HessianAccumulator(x.shape[-1], self.hessian_tokens, x.device)
                if not (last_x is x0 and last_h is o.hessian):
                    o.hessian.update(x)
                self.last = (x0, o.hessian)

        return hook

    def attach(self, modules: dict[str, nn.Module]) -> "ObserverHooks":
        """Register one hook per module (names must be keys of ``observers``); returns ``self``."""
        self.handles += [m.register_forward_pre_hook(self._hook(n), with_kwargs=True) for n, m in modules.items()]
        return self

    def remove(self) -> None:
        """Remove every hook and drop the per-batch state."""
        for h in self.handles:
            h.remove()
        self.handles, self.mask, self.last = [], None, (None, None)
