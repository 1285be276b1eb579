"""Loading the model a command names, with the one information line users see."""

from __future__ import annotations

import time

from .common import CLIError, info
from .options import torch_dtype


def load(spec: str | None, dtype_name: str, flag: str):
    """``(model, tokenizer)`` of ``spec`` (anything :func:`fp8_linear.models.load_model` takes) in
    ``dtype_name``; prints ``loaded <spec> in <s> s`` (not under ``-q``). Errors name ``flag``."""
    from fp8_linear.models import DEFAULT_MODEL, load_model

    t0 = time.perf_counter()
    try:
        model, tok = load_model(spec, dtype=torch_dtype(dtype_name))
    except (OSError, ValueError) as e:  # transformers: unreadable config / weights; ours: CheckpointError
        raise CLIError(f"{flag}: cannot load {spec or DEFAULT_MODEL!r}: {e}") from None
    info(f"loaded {spec or DEFAULT_MODEL + ' (bundled)'} in {time.perf_counter() - t0:.1f} s")
    return model, tok


def output_width(model) -> int | None:
    """Width of the model's main output: vocabulary size of a causal LM (its output embedding rows),
    hidden size of an encoder; ``None`` if neither can be read."""
    emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    w = getattr(emb, "weight", None)
    if w is not None:
        return int(w.shape[0])
    return getattr(getattr(model, "config", None), "hidden_size", None)


def require_same_outputs(model, reference, model_flag: str, ref_flag: str) -> None:
    """``model`` and ``reference`` can be compared token by token: same kind (causal LM or encoder) and
    the same output width (vocabulary), else a :class:`CLIError` naming both."""
    from fp8_linear.calibration.evaluate import is_causal_lm

    if is_causal_lm(model) != is_causal_lm(reference):
        kinds = ["a causal LM" if is_causal_lm(m) else "an encoder" for m in (model, reference)]
        raise CLIError(f"{ref_flag}: the reference is {kinds[1]} but {model_flag} is {kinds[0]}")
    a, b = output_width(model), output_width(reference)
    if a != b:
        what = "vocabulary" if is_causal_lm(model) else "hidden size"
        raise CLIError(f"{ref_flag}: the reference's {what} ({b}) differs from {model_flag}'s ({a}); "
                       "compare a model with its own unquantized version")
