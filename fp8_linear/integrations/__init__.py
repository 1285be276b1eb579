"""Integrations with other libraries: transformers' quantizer plugin API.

``import fp8_linear`` calls :func:`install`, which registers ``quant_method: "fp8_linear"``
(:class:`~fp8_linear.integrations.transformers_config.FP8LinearConfig` and its quantizer) with
``transformers.quantizers.register_quantization_config`` / ``register_quantizer``. transformers is not
patched, and not imported by ``import fp8_linear`` either (its quantizer registry costs seconds to
import): when ``transformers.quantizers.auto`` is already imported, the registration happens at once;
otherwise a one-shot import hook performs it right after that module is first imported (which
``from_pretrained`` always does first), so the registry holds ``"fp8_linear"`` whenever anyone can read it.
When the first import of transformers' registry comes from our own quantizer module, that module
registers at the end of its import instead.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys

log = logging.getLogger("fp8_linear")

#: The transformers module holding the quantization registries.
REGISTRY_MODULE = "transformers.quantizers.auto"
_QUANTIZER_MODULE = __name__ + ".transformers_quantizer"


def register_with_transformers() -> None:
    """Register ``FP8LinearConfig`` and ``FP8LinearHfQuantizer`` under ``"fp8_linear"`` (idempotent)."""
    from transformers.quantizers import auto

    from .transformers_config import QUANT_METHOD, FP8LinearConfig
    from .transformers_quantizer import FP8LinearHfQuantizer

    if QUANT_METHOD not in auto.AUTO_QUANTIZATION_CONFIG_MAPPING:
        auto.register_quantization_config(QUANT_METHOD)(FP8LinearConfig)
    if QUANT_METHOD not in auto.AUTO_QUANTIZER_MAPPING:
        auto.register_quantizer(QUANT_METHOD)(FP8LinearHfQuantizer)


class _RegisteringLoader(importlib.abc.Loader):
    """Runs the real loader of :data:`REGISTRY_MODULE`, then :func:`register_with_transformers`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        if _QUANTIZER_MODULE in sys.modules:
            return  # our quantizer module is importing transformers right now: it registers when it is done
        try:
            register_with_transformers()
        except Exception as e:  # never break importing transformers itself
            log.warning("fp8_linear: could not register the 'fp8_linear' quantizer with transformers (%s: %s)",
                        type(e).__name__, e)


class _RegistryImportHook(importlib.abc.MetaPathFinder):
    """Finds :data:`REGISTRY_MODULE` as the path finder does, with :class:`_RegisteringLoader` around its loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname != REGISTRY_MODULE:
            return None
        _remove_hook()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegistryImportHook)]


def install() -> None:
    """Register now if transformers' registry is imported, else when it is (see the module docstring)."""
    if REGISTRY_MODULE in sys.modules:
        try:
            register_with_transformers()
        except ImportError as e:
            log.warning("fp8_linear: could not register the 'fp8_linear' quantizer with transformers (%s)", e)
        return
    if not any(isinstance(f, _RegistryImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryImportHook())


__all__ = ["install", "register_with_transformers", "REGISTRY_MODULE"]
