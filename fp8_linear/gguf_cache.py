"""A converted copy of GGUF models, so that only the first load pays for the conversion.

transformers reads a ``.gguf`` file with the pure-Python ``gguf`` reader and parses it again for the
config, the tokenizer and the weights: about 30 s for the bundled SmolLM2-135M on a 2-core CPU (and
minutes when the CPU is shared). :func:`converted_folder` loads it that way once, saves the result as
an ordinary Hugging Face folder (config, tokenizer, fp32 safetensors: the exact dequantized weights)
under ``$FP8_LINEAR_CACHE/gguf/`` (default ``~/.cache/fp8_linear/gguf/``), and returns that folder;
later loads read it in about a second. The key is the file's real path, size and mtime and the
transformers version, so a changed file or library converts again. ``FP8_LINEAR_GGUF_CACHE=0``
turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

CACHE_ENV = "FP8_LINEAR_CACHE"
SWITCH_ENV = "FP8_LINEAR_GGUF_CACHE"
MARKER = "fp8_linear_gguf.ok"
SAFETENSORS_NAME = "model.safetensors"


def cache_root() -> Path:
    """``$FP8_LINEAR_CACHE`` or ``~/.cache/fp8_linear`` (the root the kernel builds use too)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fp8_linear"


def cache_key(gguf_path: str | os.PathLike) -> str:
    """``<file stem>-<16 hex>`` from the file's real path, size, mtime and the transformers version."""
    import transformers

    p = Path(gguf_path).resolve()
    st = p.stat()
    h = hashlib.sha256(f"{p}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}".encode()).hexdigest()[:16]
    return f"{p.stem}-{h}"


def converted_folder(folder: str, gguf_file: str, causal: bool | None = True) -> tuple[str, str | None]:
    """``(folder, gguf_file)`` to load from: the converted copy ``(cache folder, None)`` when the cache
    is on (converting now if needed), else the arguments unchanged (also when the cache cannot be
    written: a ``UserWarning`` says why).

    Args:
        folder / gguf_file: the GGUF file's folder and file name (as ``resolve_model_path`` gives).
        causal: load as ``AutoModelForCausalLM`` (GGUF files hold decoder LMs) or ``AutoModel``.
    """
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return folder, gguf_file
    src = os.path.join(folder, gguf_file)
    dest = cache_root() / "gguf" / cache_key(src)
    if (dest / MARKER).is_file():
        return str(dest), None
    try:
        _convert(folder, gguf_file, dest, causal is not False)
    except OSError as e:
        warnings.warn(f"gguf cache: cannot write {dest} ({e}); loading {src} directly", UserWarning, stacklevel=2)
        return folder, gguf_file
    return str(dest), None


def _convert(folder: str, gguf_file: str, dest: Path, causal: bool) -> None:
    """Load the GGUF with transformers and save model + tokenizer to ``dest`` (atomically: a temporary
    sibling folder renamed at the end)."""
    import safetensors.torch
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        cls = AutoModelForCausalLM if causal else AutoModel
        model = cls.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
        # save_pretrained refuses models loaded through transformers' gguf quantizer: write the
        # weights (a tied tensor under its first name, the input embedding) and the config (without
        # its gguf quantization entry, with the architecture a folder load needs) directly
        tensors, seen = {}, set()
        for name, t in model.state_dict().items():
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                tensors[name] = t.contiguous()
        safetensors.torch.save_file(tensors, str(tmp / SAFETENSORS_NAME), metadata={"format": "pt"})
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg["architectures"] = cfg.get("architectures") or [type(model).__name__]
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        try:
            AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file).save_pretrained(tmp)
        except (OSError, ValueError, TypeError):
            pass  # no tokenizer in the file: load_model returns None for it either way
        (tmp / MARKER).write_text(f"converted from {os.path.join(folder, gguf_file)}\n")
        if dest.exists():  # a concurrent conversion finished first
            shutil.rmtree(tmp, ignore_errors=True)
            return
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
