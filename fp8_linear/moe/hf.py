"""transformers' fused-experts interface, as fp8-linear uses it (transformers 5.x).

transformers 5 stores the experts of a mixture-of-experts layer as 3-D parameters in one module
(``Qwen3MoeExperts``: ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``) whose class carries the
decorator ``transformers.integrations.moe.use_experts_implementation``; the decorated ``forward``
looks its implementation up in ``ALL_EXPERTS_FUNCTIONS`` (an ``ExpertsInterface``). This module finds
such modules by that mark (the decorated ``forward``'s code object), not by a list of model
names, and registers the FP8 implementation under :data:`IMPLEMENTATION_NAME`.

The interface exists in the same form in transformers 5.17 and 5.24 (``ExpertsInterface`` with the
class-wide ``register``, the decorator's flags ``is_concatenated`` / ``is_transposed`` / ``has_bias``
/ ``has_gate``; 5.24 adds ``has_post_expert_norm`` and ``_is_expert_parallel``, read here with
defaults). Without it :func:`experts_api` raises an ``ImportError`` saying what is missing.
"""

from __future__ import annotations

import functools

from torch import nn

#: Name of the FP8 experts implementation in ``ALL_EXPERTS_FUNCTIONS``.
IMPLEMENTATION_NAME = "fp8_linear"


@functools.cache
def experts_api():
    """``transformers.integrations.moe`` (``ALL_EXPERTS_FUNCTIONS``, ``use_experts_implementation``).

    Raises ``ImportError`` naming the installed transformers version when the module or one of the
    two names is missing (transformers < 5, or a future rename).
    """
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"fused MoE experts need transformers >= 5 (transformers.integrations.moe); {e}") from e
    try:
        from transformers.integrations import moe
    except ImportError as e:
        raise ImportError(
            f"fused MoE experts need transformers.integrations.moe (transformers >= 5); installed transformers "
            f"{transformers.__version__} has none ({e})") from e
    for attr in ("ALL_EXPERTS_FUNCTIONS", "use_experts_implementation", "ExpertsInterface"):
        if not hasattr(moe, attr):
            raise ImportError(f"fused MoE experts need transformers.integrations.moe.{attr}; installed transformers "
                              f"{transformers.__version__} has no such name")
    return moe


@functools.cache
def _mark():
    """The code object of the ``forward`` that ``use_experts_implementation`` installs."""
    class _Probe(nn.Module):
        def __init__(self, config):
            super().__init__()

        def forward(self, *args, **kwargs):
            return None

    return experts_api().use_experts_implementation(_Probe).forward.__code__


def is_fused_experts(module: nn.Module) -> bool:
    """True when ``module``'s class runs the forward of ``use_experts_implementation`` (and is not FP8 yet)."""
    fwd = getattr(type(module), "forward", None)
    return getattr(fwd, "__code__", None) is _mark()


def find_fused_experts(model: nn.Module) -> dict[str, nn.Module]:
    """Every fused-experts module of ``model`` by qualified name, in module order (none without transformers 5)."""
    try:
        _mark()
    except ImportError:
        return {}
    return {name: m for name, m in model.named_modules() if is_fused_experts(m)}


_interface = None  # ALL_EXPERTS_FUNCTIONS once registered (a plain global: torch.compile traces the lookup)


def register_implementation(forward) -> None:
    """Register ``forward`` as the experts implementation :data:`IMPLEMENTATION_NAME` (class-wide)."""
    global _interface
    api = experts_api()
    api.ExpertsInterface.register(IMPLEMENTATION_NAME, forward)
    _interface = api.ALL_EXPERTS_FUNCTIONS


def implementation():
    """The registered FP8 experts forward (what an :class:`~fp8_linear.moe.experts.FP8Experts` runs)."""
    if _interface is None:
        raise ImportError("the fp8_linear experts implementation is not registered (transformers' experts interface is missing)")
    return _interface[IMPLEMENTATION_NAME]
