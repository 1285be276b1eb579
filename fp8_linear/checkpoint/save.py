"""``save_quantized``: a model of ``FP8Linear`` modules -> a compressed-tensors checkpoint folder.

The folder is what ``model.save_pretrained`` writes (``config.json`` with the
``quantization_config`` of ``ct_config.py``, sharded safetensors: per quantized Linear ``weight``
F8_E4M3 ``[out, in]``, ``weight_scale`` fp32 ``[1]`` / ``[out, 1]`` / ``[ceil(out/128), ceil(in/128)]``,
``input_scale`` fp32 ``[1]`` for static schemes, ``bias``), plus the tokenizer files when given.

Atomic: everything is written into a hidden temporary sibling folder that carries the marker file
:data:`INCOMPLETE_MARKER` (``load_quantized`` refuses such a folder), checked, flushed to disk,
and renamed onto the target only at the end. A killed save leaves at most that refused sibling.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from torch import nn

from ..errors import CheckpointError, FP8LinearError
from ..module import FP8Linear
from ..scheme import QuantScheme
from .ct_config import build_ct_config

INCOMPLETE_MARKER = ".fp8_linear_incomplete"
DEFAULT_MAX_SHARD_SIZE = "5GB"
_UNSET = object()


class CheckpointExistsError(CheckpointError, FileExistsError):
    """The target folder of a save exists and is not empty (pass ``overwrite=True`` to replace it)."""


def quantized_groups(model: nn.Module) -> tuple[list[tuple[list[str], QuantScheme]], list[str]]:
    """``(groups, ignore)`` of a quantized model: ``(targets, scheme)`` per distinct scheme (``["Linear"]``
    when one scheme covers every quantized module, else exact module names) and the names of the
    ``nn.Linear`` modules left unquantized."""
    by_scheme: dict[QuantScheme, list[str]] = {}
    ignore = []
    for name, mod in model.named_modules():
        if isinstance(mod, FP8Linear):
            try:
                mod.check()
            except (FP8LinearError, TypeError, ValueError) as e:
                raise CheckpointError(f"model.{name}: cannot save an invalid FP8Linear ({e})") from e
            by_scheme.setdefault(mod.scheme, []).append(name)
        elif isinstance(mod, nn.Linear):
            ignore.append(name)
    if not by_scheme:
        raise CheckpointError("model: expected at least one FP8Linear module (quantize the model first), got none")
    if len(by_scheme) == 1:
        return [(["Linear"], next(iter(by_scheme)))], ignore
    return [(names, scheme) for scheme, names in by_scheme.items()], ignore


def _fsync_tree(folder: str) -> None:
    for root, _, files in os.walk(folder):
        for fn in files:
            with open(os.path.join(root, fn), "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _untie_quantized_head(model: nn.Module):
    """If the output embedding is an FP8Linear, it no longer shares the input embedding's weight:
    say so in the config (returns the previous ``tie_word_embeddings`` to restore, or ``_UNSET``)."""
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    if isinstance(head, FP8Linear) and getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
        return True
    return _UNSET


def _move_into_place(tmp: str, target: str, overwrite: bool) -> None:
    if not os.path.lexists(target):
        os.replace(tmp, target)
        return
    if os.path.isdir(target) and not os.listdir(target):
        os.replace(tmp, target)  # rename(2) may replace an empty directory
        return
    trash = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
    os.replace(target, os.path.join(trash, "old"))
    os.replace(tmp, target)
    shutil.rmtree(trash, ignore_errors=True)


def save_quantized(model: nn.Module, path: str | os.PathLike, tokenizer=None, overwrite: bool = False,
                   max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE) -> str:
    """Save a quantized transformers model (its ``FP8Linear`` modules) as a compressed-tensors checkpoint.

    Args:
        model: a ``transformers.PreTrainedModel`` quantized in place (``quantize_model`` or
            ``FP8Linear.from_linear``); every ``FP8Linear`` records its scheme.
        path: target folder; it must not exist or be empty unless ``overwrite=True``.
        tokenizer: saved alongside (``tokenizer.save_pretrained``) when given.
        overwrite: replace an existing non-empty ``path`` (only after the new checkpoint is complete).
        max_shard_size: largest safetensors shard (``save_pretrained``'s argument).

    Returns:
        the absolute path of the checkpoint folder.

    Raises:
        CheckpointExistsError: ``path`` exists and is not empty, and ``overwrite`` is False.
        CheckpointError: the model has no FP8Linear, or one with invalid tensors.
        TypeError: ``model`` is not a transformers model.
    """
    if not isinstance(model, nn.Module) or not callable(getattr(model, "save_pretrained", None)):
        raise TypeError(f"model: expected a transformers PreTrainedModel, got {type(model).__name__}")
    target = os.path.abspath(os.fspath(path))
    if os.path.lexists(target) and not (os.path.isdir(target) and not os.listdir(target)) and not overwrite:
        raise CheckpointExistsError(f"path: expected a new or empty folder, got {target!r} (not empty; pass overwrite=True)")
    groups, ignore = quantized_groups(model)
    from .. import __version__

    qc = build_ct_config(groups, ignore, __version__)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    old_qc = model.config.__dict__.get("quantization_config", _UNSET)
    old_quantizer = model.__dict__.get("hf_quantizer", _UNSET)
    old_tie = _UNSET
    try:
        open(os.path.join(tmp, INCOMPLETE_MARKER), "wb").close()
        model.config.quantization_config = qc
        # A model read from GGUF carries transformers' gguf quantizer, which refuses to save; its
        # weights are already dequantized and the FP8 ones are ours, described by ``qc``.
        if old_quantizer is not _UNSET:
            model.hf_quantizer = None
        old_tie = _untie_quantized_head(model)
        model.save_pretrained(tmp, max_shard_size=max_shard_size)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        from .shards import list_tensors

        list_tensors(tmp)  # the headers we just wrote parse and cover their files
        _fsync_tree(tmp)
        os.remove(os.path.join(tmp, INCOMPLETE_MARKER))
        _move_into_place(tmp, target, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if old_qc is _UNSET:
            model.config.__dict__.pop("quantization_config", None)
        else:
            model.config.quantization_config = old_qc
        if old_quantizer is not _UNSET:
            model.hf_quantizer = old_quantizer
        if old_tie is not _UNSET:
            model.config.tie_word_embeddings = old_tie
    return target
