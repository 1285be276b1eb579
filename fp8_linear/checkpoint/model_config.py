"""``config.json`` of a checkpoint -> a transformers config and the empty (meta) model it describes.

The file is untrusted: before transformers sees it, :func:`check_model_config` checks the fields
that decide what gets built (``model_type`` known to transformers; ``architectures`` a list naming a
transformers model class of that model type, never an auto class or another model's class; sizes
positive integers within :data:`MAX_SIZE`, layer counts no more than the tensors stored; norms'
epsilons and ``rope_theta`` finite; ``tie_word_embeddings`` a boolean), recursing into nested
``*_config`` objects. Whatever else transformers refuses while building is reported as a
:class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..errors import CheckpointError
from .fields import fail, get_bool, get_int, get_number, get_str

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
#: Largest size a dimension field may have (vocabularies, widths, context lengths: real ones < 2**24).
MAX_SIZE = 2**24
#: Dimension fields that must be positive integers when present.
SIZE_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "n_embd", "n_head", "n_positions", "n_inner", "d_model", "num_heads", "ffn_dim",
    "d_ff", "d_kv", "type_vocab_size",
)
#: Layer counts: each layer stores at least one tensor, so a count above the stored tensors is refused
#: before a model of that many layers is built.
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")
EPS_FIELDS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
POSITIVE_FLOAT_FIELDS = ("rope_theta",)
DTYPE_FIELDS = ("torch_dtype", "dtype")
FLOAT_DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "auto")


def _check_fields(cfg: dict, where: str, max_layers: int) -> None:
    for key in SIZE_FIELDS:
        get_int(cfg, key, where, lo=1, hi=MAX_SIZE)
    for key in LAYER_FIELDS:
        get_int(cfg, key, where, lo=1, hi=max(1, max_layers))
    for key in EPS_FIELDS:
        get_number(cfg, key, where)
    for key in POSITIVE_FLOAT_FIELDS:
        get_number(cfg, key, where, positive=True)
    get_bool(cfg, "tie_word_embeddings", where)
    for key in DTYPE_FIELDS:
        get_str(cfg, key, where, FLOAT_DTYPE_NAMES)
    for key, value in cfg.items():
        if key.endswith("_config") and key != "quantization_config" and value is not None:
            if not isinstance(value, dict):
                raise fail(f"{where}.{key}", "an object", value)
            _check_fields(value, f"{where}.{key}", max_layers)


def _model_class(cfg: dict, config_cls, where: str):
    """The transformers model class ``architectures[0]`` names (``None`` when the field is absent or
    names no transformers class: the model type's causal-LM / base auto class is used instead)."""
    import transformers

    archs = cfg.get("architectures")
    if archs is None:
        return None
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) and a.isidentifier() for a in archs):
        raise fail(f"{where}.architectures", "a non-empty list of model class names", archs)
    try:
        cls = getattr(transformers, archs[0], None)
    except Exception:  # a lazy import of an optional dependency failing
        cls = None
    if cls is None:
        log.warning("%s.architectures: %r is not a transformers class; building the %s auto class instead",
                    where, archs[0], cfg.get("model_type"))
        return None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise fail(f"{where}.architectures[0]", "a transformers model class (not an auto class or helper)", archs[0])
    if not issubclass(config_cls, cls.config_class):
        raise fail(f"{where}.architectures[0]",
                   f"a model class of model_type {cfg.get('model_type')!r} ({config_cls.__name__}), "
                   f"not one of {cls.config_class.__name__}", archs[0])
    return cls


def build_config(cfg: dict, where: str, max_layers: int):
    """``(config, model_class)`` of the checked ``config.json`` dict ``cfg`` (without its
    ``quantization_config``); ``model_class`` is ``None`` when an auto class must pick it."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise fail(f"{where}.model_type", "a model type transformers knows", model_type)
    if model_type == "mistral" and "layer_types" in cfg:  # as AutoConfig does
        model_type = cfg["model_type"] = "ministral"
    _check_fields(cfg, where, max_layers)
    config_cls = CONFIG_MAPPING[model_type]
    cls = _model_class(cfg, config_cls, where)
    try:
        config = config_cls.from_dict(cfg)
    except Exception as e:  # transformers' own validation (rope parameters, layer types, ...)
        raise CheckpointError(f"{where}: transformers cannot read it ({type(e).__name__}: {str(e)[:300]})") from e
    return config, cls


def _no_init_weights():
    """transformers' context that skips weight initialization (pointless on meta), where it has one."""
    import contextlib

    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            return contextlib.nullcontext()
    return no_init_weights()


def build_empty_model(config, cls, dtype: torch.dtype | None, where: str) -> nn.Module:
    """The model of ``config`` with parameters on the meta device (buffers real), tied, in eval mode."""
    import transformers
    from accelerate import init_empty_weights

    if cls is None:
        causal = type(config) in transformers.AutoModelForCausalLM._model_mapping
        cls = transformers.AutoModelForCausalLM if causal else transformers.AutoModel
        build = cls.from_config
    else:
        build = cls._from_config
    kw = {"dtype": dtype} if dtype is not None else {}
    try:
        with init_empty_weights(), _no_init_weights():
            model = build(config, **kw)
        tie = getattr(model, "tie_weights", None)
        if callable(tie):
            tie()  # transformers skips tying on meta; tied names then share one parameter (alias groups)
    except Exception as e:
        raise CheckpointError(f"{where}: transformers cannot build {getattr(cls, '__name__', cls)} from it "
                              f"({type(e).__name__}: {str(e)[:300]})") from e
    return model.eval()
