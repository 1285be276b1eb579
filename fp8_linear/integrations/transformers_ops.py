"""The weight-conversion op transformers runs on each targeted ``<layer>.weight`` as it loads.

transformers (5.x) loads a checkpoint tensor by tensor through ``core_model_loading``: a parameter for
which the quantizer's ``param_needs_quantization`` is true gets the quantizer's ``get_quantize_ops()``
op, whose ``convert`` receives ``{full parameter name: [tensor]}`` (after the model's own renamings and
converters) and returns the parameters to set. Ours returns the FP8 ``weight`` and its ``weight_scale``.
"""

from __future__ import annotations

import torch
from transformers.core_model_loading import ConversionOps


class FP8QuantizeOnLoad(ConversionOps):
    """High-precision ``<layer>.weight`` -> FP8 ``<layer>.weight`` + fp32 ``<layer>.weight_scale``.

    Entries that are not quantization targets (e.g. a fused converter's other outputs) pass through.
    A weight that cannot be quantized (NaN / inf, not 2-D) is left out; ``FP8LinearHfQuantizer`` then
    raises ``LoadQuantizationError`` after loading with the layer's name and the reason.
    """

    def __init__(self, hf_quantizer):
        self.hf_quantizer = hf_quantizer

    @torch.no_grad()
    def convert(self, input_dict: dict, *args, **kwargs) -> dict:
        out = {}
        for key, value in input_dict.items():
            if not self.hf_quantizer.param_needs_quantization(None, key):
                out[key] = value
                continue
            if isinstance(value, list) and len(value) != 1:
                raise ValueError(f"{key}: expected one checkpoint tensor, got {len(value)}")
            try:
                out.update(self.hf_quantizer.quantize_weight(key, value[0] if isinstance(value, list) else value))
            except (ValueError, TypeError):
                # recorded by quantize_weight; the weight stays unloaded and the quantizer raises after
                # loading, naming the layer (transformers would only log a failed conversion)
                continue
        return out
