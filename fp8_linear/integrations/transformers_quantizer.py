"""``FP8LinearHfQuantizer``: quantize each ``nn.Linear`` to :class:`~fp8_linear.FP8Linear` as its weight loads.

What ``from_pretrained(path, quantization_config=FP8LinearConfig(...))`` does with it:

1. ``validate_environment``: the device map (also once more after ``"auto"`` is resolved) and the
   backend are checked; offloading to disk, or CPU offload beside an accelerator, is refused.
2. ``_process_model_before_weight_loading`` (model on the meta device): every targeted ``nn.Linear``
   becomes an ``FP8Linear`` whose ``weight`` is still a meta placeholder in the Linear's own dtype,
   so that every transformers version materializes the checkpoint tensor in high precision.
3. For each ``<layer>.weight`` transformers loads, ``param_needs_quantization`` says yes and the
   conversion op of ``transformers_ops.py`` turns the one high-precision tensor into the FP8
   ``weight`` and fp32 ``weight_scale`` (min-max scales, round to nearest: exactly what
   ``FP8Linear.from_linear`` computes). Loading is sequential for on-the-fly quantization, so at most
   one layer's high-precision weight exists at a time.
4. ``_process_model_after_weight_loading``: every target is checked (a tensor missing from the
   checkpoint or a failed conversion raises, naming the layer), pinned to ``FP8LinearConfig.backend``
   when one is named (:func:`pin_backend`), and ``model.config.quantization_config``
   becomes the compressed-tensors config that ``fp8_linear.save_quantized`` writes, so
   ``model.save_pretrained(path)`` writes our checkpoint, which ``fp8_linear.load_quantized`` and vLLM read.

Written against transformers 5.17 and 5.24 (the quantizer hooks they share; 5.17 materializes a
quantized parameter in its placeholder's dtype, 5.24 in the load dtype: both high precision here).
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from transformers.quantizers.base import HfQuantizer

from ..errors import FP8LinearError
from ..formats import FP8_DTYPES, SCALE_DTYPE
from ..module import FP8Linear, set_plan
from ..quantize import quantize_fp8, scale_shape
from ..scheme import QuantScheme
from .host_memory import release_freed_host_memory
from .transformers_config import FP8LinearConfig, QUANT_METHOD

log = logging.getLogger("fp8_linear")

#: Where a device map may put modules besides accelerators: these two mean offloading.
OFFLOAD_DEVICES = ("cpu", "disk")
#: ``from_pretrained`` dtypes of the high-precision parts (embeddings, norms, biases, ignored Linear layers).
HIGH_PRECISION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Bytes per FP8 weight element (for ``device_map="auto"`` sizing).
FP8_ELEMENT_SIZE = 1
#: The FP8Linear scale granularity of each weight granularity (as ``quantize_fp8`` names them).
_WEIGHT_GRAN = {"tensor": "tensor", "channel": "channel", "block": "block"}


class LoadQuantizationError(FP8LinearError, RuntimeError):
    """``from_pretrained`` with :class:`FP8LinearConfig` could not quantize a Linear (the layer is named)."""


def _device_kind(device) -> str:
    """``"disk"``, ``"cpu"`` or ``"accelerator"`` (an int or any other device name) of a device-map value."""
    name = "accelerator" if isinstance(device, int) else str(device).split(":")[0]
    return name if name in OFFLOAD_DEVICES else "accelerator"


def check_device_map(device_map) -> None:
    """``ValueError`` for a device map that offloads FP8 weights (``"disk"``, or ``"cpu"`` beside accelerators).

    ``device_map``: ``None``, a string (``"auto"``, ``"cpu"``, ``"cuda:0"``, ...), a ``torch.device``, an
    int, or an accelerate dict ``{module name: device}``.
    """
    if not isinstance(device_map, dict):
        if isinstance(device_map, str) and device_map == "disk":
            raise ValueError("device_map: 'disk' offloads FP8 weights to disk, which fp8_linear does not support")
        return
    kinds = {_device_kind(d) for d in device_map.values()}
    if "disk" in kinds:
        where = sorted(k for k, d in device_map.items() if str(d) == "disk")
        raise ValueError(
            f"device_map: offloading FP8 weights to disk is not supported (modules {where[:3]} map to 'disk'); "
            f"give the model more GPU or CPU memory (max_memory), or quantize and save it on a larger machine "
            f"(fp8_linear.save_quantized) and load the FP8 checkpoint with fp8_linear.load_quantized")
    if "cpu" in kinds and "accelerator" in kinds:
        where = sorted(k for k, d in device_map.items() if str(d) == "cpu")
        raise ValueError(
            f"device_map: CPU offload of FP8 weights beside an accelerator is not supported (modules {where[:3]} "
            f"map to 'cpu' while others map to a GPU); put every module on GPUs, or the whole model on 'cpu'")


def _map_devices(device_map) -> list[torch.device]:
    """The torch devices a device map names (``[]`` for ``None`` and the unresolved ``"auto"`` family)."""
    if device_map is None:
        return [torch.device("cpu")]
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    out = []
    for d in values:
        if isinstance(d, str) and d in ("auto", "balanced", "balanced_low_0", "sequential", "disk"):
            continue
        out.append(torch.device("cuda", d) if isinstance(d, int) else torch.device(d))
    return out


def pin_backend(name: str, layer_name: str, layer: FP8Linear) -> None:
    """Make ``layer`` run on backend ``name`` (instead of the automatic choice of docs/design.md section 4).

    The plan holds until the layer's tensors move or change or ``fp8_linear.settings.reload()`` runs;
    then the layer chooses automatically again. Raises :class:`~fp8_linear.BackendUnavailableError`
    naming the layer and the backend's reason when the backend cannot serve it on its device.
    """
    from .. import settings
    from ..backends import PINNED_ATTR, LayerPlan, LinearSpec, get_backend
    from ..errors import BackendUnavailableError

    backend = get_backend(name)
    device = layer.weight.device
    ok, why = backend.can_implement(layer, device)
    if not ok:
        raise BackendUnavailableError(f"{layer_name}: FP8LinearConfig(backend={name!r}) cannot run this layer on {device}: {why}")
    backend.process_weights(layer)
    layer.__dict__[PINNED_ATTR] = name  # later re-plans (device moves, replaced weights) keep it
    set_plan(layer, LayerPlan(backend, LinearSpec.of(layer), layer._parameters["weight"], settings.GENERATION,
                              f"chosen by FP8LinearConfig(backend={name!r})"))


class FP8LinearHfQuantizer(HfQuantizer):
    """The transformers quantizer of ``quant_method: "fp8_linear"`` (see the module docstring)."""

    requires_calibration = False
    quantization_config: FP8LinearConfig

    def __init__(self, quantization_config: FP8LinearConfig, **kwargs):
        super().__init__(quantization_config, **kwargs)
        if self.pre_quantized:
            raise ValueError(
                f"quantization_config: a checkpoint whose config.json says quant_method {QUANT_METHOD!r} is not one "
                f"we write (ours say 'compressed-tensors'); load FP8 checkpoints with fp8_linear.load_quantized(path), "
                f"and pass FP8LinearConfig to from_pretrained only for a high-precision checkpoint")
        self.scheme: QuantScheme = quantization_config.quant_scheme
        #: FP8Linear module names -> their scheme, filled before the weights load.
        self.targets: dict[str, QuantScheme] = {}
        #: Errors of the conversion op by layer (transformers logs and skips a failed conversion).
        self.errors: dict[str, str] = {}

    # ------------------------------------------------------------------ environment
    def validate_environment(self, *args, device_map=None, **kwargs) -> None:
        """Refuse offloading device maps and a backend that cannot serve the target device."""
        check_device_map(device_map)
        name = self.quantization_config.backend
        if name is None:
            return
        from .. import settings
        from ..backends import BACKEND_ENV, get_backend

        forced = settings.get().backend
        if forced and forced != name:
            raise ValueError(f"backend: FP8LinearConfig(backend={name!r}) disagrees with {BACKEND_ENV}={forced} "
                             f"(which forces every FP8Linear); unset one of them")

        backend = get_backend(name)
        for device in _map_devices(device_map):
            ok, why = backend.supports(device)
            if not ok:
                raise ValueError(f"backend: {name!r} cannot run on {device} (device_map={device_map!r}): {why}")

    def update_dtype(self, dtype):
        """The dtype of the high-precision parts: bf16 / fp16 / fp32 (``None``: transformers' default)."""
        if dtype is not None and dtype not in HIGH_PRECISION_DTYPES:
            raise TypeError(f"dtype: expected torch.bfloat16, torch.float16 or torch.float32 with FP8LinearConfig, got {dtype}")
        return dtype

    @property
    def quantized_element_size(self) -> float:
        return FP8_ELEMENT_SIZE

    def param_element_size(self, model, param_name: str, param) -> float:
        """1 byte for a weight that loads as FP8, else the parameter's own element size."""
        return FP8_ELEMENT_SIZE if self.param_needs_quantization(model, param_name) else param.element_size()

    # ------------------------------------------------------------------ before loading
    def select_targets(self, model: nn.Module) -> dict[str, nn.Linear]:
        """The ``nn.Linear`` modules to quantize: not ignored (compressed-tensors patterns), not tied to
        another module's weight, not in the model's ``_keep_in_fp32_modules``."""
        from transformers.quantizers.quantizers_utils import should_convert_module

        from ..checkpoint.plan import pattern_matches

        ignore = self.quantization_config.ignore
        tied = set()
        for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
            tied |= {target.removesuffix(".weight"), source.removesuffix(".weight")}
        owners: dict[int, int] = {}
        for mod in model.modules():
            for p in mod.parameters(recurse=False):
                owners[id(p)] = owners.get(id(p), 0) + 1
        keep_fp32 = list(getattr(model, "_keep_in_fp32_modules", None) or [])
        used = {p: False for p in ignore}
        chosen = {}
        for name, mod in model.named_modules():
            hits = [p for p in ignore if pattern_matches(p, name, mod, "ct")]
            for p in hits:
                used[p] = True
            if not isinstance(mod, nn.Linear) or isinstance(mod, FP8Linear) or hits or name in tied or owners.get(id(mod.weight), 0) > 1:
                continue
            if keep_fp32 and not should_convert_module(name, keep_fp32):
                continue
            chosen[name] = mod
        for p, ok in used.items():
            if not ok and p != "lm_head":
                log.warning("FP8LinearConfig.ignore: pattern %r matches no module of %s", p, type(model).__name__)
        if not chosen:
            raise ValueError(f"quantization_config: FP8LinearConfig leaves no nn.Linear of {type(model).__name__} to quantize "
                             f"(ignore={ignore})")
        return chosen

    def _process_model_before_weight_loading(self, model, **kwargs):
        for name, lin in self.select_targets(model).items():
            bias_dtype = lin.bias.dtype if lin.bias is not None else torch.float32
            new = FP8Linear(lin.in_features, lin.out_features, lin.bias is not None, self.scheme, device="meta",
                            bias_dtype=bias_dtype)
            # The high-precision checkpoint tensor loads into this placeholder's dtype (transformers 5.17
            # casts a quantized parameter to its placeholder's dtype before the conversion op runs).
            new.weight = nn.Parameter(torch.empty_like(lin.weight, device="meta"), requires_grad=False)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, new)
            self.targets[name] = self.scheme
        return model

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        """True for ``<target>.weight`` (the one tensor that loads in high precision and becomes FP8)."""
        owner, _, leaf = param_name.rpartition(".")
        return leaf == "weight" and owner in self.targets and not self.pre_quantized

    def get_quantize_ops(self):
        from .transformers_ops import FP8QuantizeOnLoad

        return FP8QuantizeOnLoad(self)

    def quantize_weight(self, key: str, w: torch.Tensor) -> dict[str, nn.Parameter]:
        """``{key: FP8 weight [out, in], <layer>.weight_scale: fp32 scale}`` of the high-precision ``w``.

        Bitwise what ``FP8Linear.from_linear`` gives the same weight with the same scheme.
        """
        owner = key.rpartition(".")[0]
        scheme = self.targets[owner]
        if w.device.type == "cpu":
            # the previous layers' high-precision weights are freed by now: give their pages back, or the
            # heap fragmentation between the FP8 tensors that stay keeps them resident (host_memory.py)
            release_freed_host_memory()
        try:
            if w.dim() != 2:
                raise ValueError(f"expected a 2-D weight [out, in], got shape {list(w.shape)}")
            # one reduction instead of torch.isfinite over the weight (~50x slower on a CPU); a non-finite
            # sum of finite values (an overflow) is told apart by the exact check
            if not bool(torch.isfinite(w.sum(dtype=torch.float32))) and not bool(torch.isfinite(w).all()):
                raise ValueError(f"expected finite values, got NaN/inf in a {list(w.shape)} weight")
            q, s = quantize_fp8(w.to(torch.float32), scheme.fmt, _WEIGHT_GRAN[scheme.weight_granularity])
        except (ValueError, TypeError) as e:
            self.errors[owner] = f"{key}: {e}"
            raise
        s = s.to(SCALE_DTYPE).reshape(scale_shape(tuple(w.shape), _WEIGHT_GRAN[scheme.weight_granularity]))
        return {key: nn.Parameter(q, requires_grad=False), f"{owner}.weight_scale": nn.Parameter(s, requires_grad=False)}

    # ------------------------------------------------------------------ after loading
    def _process_model_after_weight_loading(self, model, **kwargs):
        from .. import __version__
        from ..checkpoint.ct_config import build_ct_config
        from ..checkpoint.save import quantized_groups

        for name in self.targets:
            mod = model.get_submodule(name)
            if mod.weight.dtype not in FP8_DTYPES or mod.weight.device.type == "meta":
                why = self.errors.get(name, f"{name}.weight was not in the checkpoint or did not load")
                raise LoadQuantizationError(f"{name}: could not quantize the Linear while loading ({why})")
            try:
                mod.check()
            except (FP8LinearError, TypeError, ValueError) as e:
                raise LoadQuantizationError(f"{name}: {e}") from e
        if self.quantization_config.backend is not None:
            for name in self.targets:
                pin_backend(self.quantization_config.backend, name, model.get_submodule(name))
        release_freed_host_memory()
        from ..moe.convert import quantize_fused_experts  # fused MoE experts (docs/moe.md): FP8 after loading

        quantize_fused_experts(model, self.scheme, self.quantization_config.ignore)
        groups, ignore = quantized_groups(model)
        # save_pretrained writes this: the compressed-tensors checkpoint of fp8_linear.save_quantized.
        model.config.quantization_config = build_ct_config(groups, ignore, __version__)
        return model

    def is_serializable(self, *args, **kwargs) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


__all__ = ["FP8LinearHfQuantizer", "LoadQuantizationError", "check_device_map", "pin_backend"]

# Importing this module may have been what imported transformers' registry (see ``__init__.py``).
from . import register_with_transformers  # noqa: E402

register_with_transformers()
