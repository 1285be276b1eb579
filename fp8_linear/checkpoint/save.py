"""``save_quantized``: a model of ``FP8Linear`` modules -> a compressed-tensors checkpoint folder.

The folder is what ``model.save_pretrained`` writes (``config.json`` with the
``quantization_config`` of ``ct_config.py``, sharded safetensors: per quantized Linear ``weight``
F8_E4M3 ``[out, in]``, ``weight_scale`` fp32 ``[1]`` / ``[out, 1]`` / ``[ceil(out/128), ceil(in/128)]``,
``input_scale`` fp32 ``[1]`` for static schemes, ``bias``), plus the tokenizer files when given.
Files are 0666 and folders 0777 minus the umask (0644 / 0755 under the usual 022).

The protocol (docs/checkpoints.md; the mechanics in ``swap.py``): nothing but a checkpoint is ever
replaced, and only with ``overwrite=True``; everything is written into a hidden sibling work
folder that carries :data:`INCOMPLETE_MARKER`, checked, flushed to disk, and swapped onto the
target in one atomic step, so the target names the old or the new checkpoint at every instant.
"""

from __future__ import annotations

import fnmatch
import os

from torch import nn

from ..errors import CheckpointError, FP8LinearError
from ..module import FP8Linear
from ..scheme import QuantScheme
from . import swap
from ..embedding import shares_weights
from .ct_config import build_ct_config
from .embeddings import add_to_config
from .folder import folder_path
from .swap import INCOMPLETE_MARKER
from .values import nonfinite_fp8

DEFAULT_MAX_SHARD_SIZE = "5GB"
#: Modes of saved files and folders before the umask (as ``open`` / ``mkdir`` use them).
FILE_MODE, FOLDER_MODE = 0o666, 0o777
_UNSET = object()
#: Names of the files a Hugging Face checkpoint folder holds (weights, configs, tokenizer, model card,
#: recipes). ``overwrite=True`` replaces a folder only when it holds ``config.json``, weights, and
#: nothing but such files: never a folder with sub-folders or other files.
CHECKPOINT_FILE_PATTERNS = (
    "*.json", "*.safetensors", "*.model", "*.tiktoken", "*.jinja", "*.yaml", "*.yml", "merges.txt", "vocab.txt",
    "README.md", "LICENSE*", "USE_POLICY.md", "NOTICE*", ".gitattributes", INCOMPLETE_MARKER,
)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
#: The one sub-folder a checkpoint folder may hold: the metadata of a ``huggingface_hub`` local-dir download.
HF_DOWNLOAD_CACHE = (".cache", "huggingface")


class CheckpointExistsError(CheckpointError, FileExistsError):
    """The target folder of a save exists and is not empty (pass ``overwrite=True`` to replace it), or
    it is not a checkpoint folder, which ``overwrite`` never replaces."""


def _hf_download_cache(entry: os.DirEntry) -> bool:
    """True for the ``.cache/huggingface`` folder ``huggingface_hub`` writes into a ``--local-dir`` download."""
    if entry.name != HF_DOWNLOAD_CACHE[0] or not entry.is_dir(follow_symlinks=False):
        return False
    try:
        return os.listdir(entry.path) == [HF_DOWNLOAD_CACHE[1]]
    except OSError:
        return False


def not_a_checkpoint(folder: str) -> str | None:
    """Why ``folder`` is not a checkpoint folder that ``overwrite=True`` may replace, or None when it is."""
    try:
        entries = list(os.scandir(folder))
    except OSError as e:
        return f"cannot be listed ({e.strerror})"
    names = {e.name for e in entries}
    if "config.json" not in names or not names & set(WEIGHT_FILES):
        return f"holds no config.json and {' / '.join(WEIGHT_FILES)} (it is not a checkpoint)"
    foreign = sorted(e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries
                     if not _hf_download_cache(e) and (e.is_dir(follow_symlinks=False)
                                                       or not any(fnmatch.fnmatchcase(e.name, p) for p in CHECKPOINT_FILE_PATTERNS)))
    if foreign:
        shown = ", ".join(repr(f) for f in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        return f"holds {shown}, which are not checkpoint files"
    return None


def _target_state(target: str, overwrite: bool) -> str:
    """``"missing"``, ``"empty"`` or ``"checkpoint"`` (replaceable); :class:`CheckpointExistsError` otherwise."""
    if not os.path.lexists(target):
        return "missing"
    if os.path.islink(target):
        raise CheckpointExistsError(f"path: expected a new or empty folder, got {target!r} (a symbolic link)")
    if not os.path.isdir(target):
        raise CheckpointExistsError(f"path: expected a new or empty folder, got {target!r} (not a folder)")
    if not os.listdir(target):
        return "empty"
    if not overwrite:
        raise CheckpointExistsError(f"path: expected a new or empty folder, got {target!r} (not empty; pass overwrite=True)")
    why = not_a_checkpoint(target)
    if why is not None:
        raise CheckpointExistsError(f"path: overwrite=True replaces only a checkpoint folder, got {target!r}, which {why}; "
                                    "nothing was deleted")
    return "checkpoint"


def interrupted_save_hint(target: str) -> str:
    """A sentence for a load of a missing ``target`` whose previous checkpoint an interrupted save moved aside."""
    old = swap.moved_aside(target)
    return (f"; an interrupted save moved the previous checkpoint to {old!r}: the next save_quantized to this path "
            "restores it, or rename it back") if old else ""


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
            bad, first = nonfinite_fp8(mod.weight, mod.scheme.fmt)
            if bad:  # a load would refuse the checkpoint
                raise CheckpointError(f"model.{name}.weight: expected finite {mod.scheme.fmt} values, got {bad} NaN/inf "
                                      f"entries (first at flat index {first}); nothing was saved")
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
        swap.fsync_dir(root)


def current_umask() -> int:
    """The process umask (read from ``/proc/self/status`` where it is, else set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _readable_by_others(folder: str) -> None:
    """Files 0666 and folders 0777 minus the umask (0644 / 0755 under 022): some writers (safetensors
    shards) create 0600 files."""
    mask = current_umask()
    for root, dirs, files in os.walk(folder):
        os.chmod(root, FOLDER_MODE & ~mask)
        for fn in files:
            os.chmod(os.path.join(root, fn), FILE_MODE & ~mask)


def _untie_quantized_head(model: nn.Module):
    """If the output embedding is an FP8Linear, it no longer shares the input embedding's weight:
    say so in the config (returns the previous ``tie_word_embeddings`` to restore, or ``_UNSET``)."""
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    if isinstance(head, FP8Linear) and any(shares_weights(m, head) for m in model.modules()):
        return _UNSET  # one FP8 table for both (an FP8Embedding tied to it): the file holds it once, still tied
    if isinstance(head, FP8Linear) and getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
        return True
    return _UNSET


def _place(work: str, target: str, overwrite: bool) -> None:
    """Put finished ``work`` at ``target`` (the parent locked): see ``swap.py``."""
    state = _target_state(target, overwrite)
    if state == "missing":
        try:
            swap.rename_noreplace(work, target)
            return
        except FileExistsError:
            state = _target_state(target, overwrite)  # created meanwhile by another writer: decide again
            if state == "missing":
                raise CheckpointExistsError(f"path: expected a new or empty folder, got {target!r} (changing while saving)") from None
    if not swap.exchange(work, target):
        swap.two_rename_swap(work, target)
        return
    # ``work`` now names the previous folder: it must still be what we decided to replace
    why = ("is no longer empty" if os.listdir(work) else None) if state == "empty" else not_a_checkpoint(work)
    if why is not None:
        swap.exchange(work, target)
        raise CheckpointExistsError(f"path: expected a new or empty folder, got {target!r}, which {why} "
                                    "(written by another writer while saving); nothing was deleted")
    swap.fsync_dir(os.path.dirname(target))
    swap.discard(work, target)


def _check_name(target: str) -> None:
    name = os.path.basename(target)
    try:
        limit = os.pathconf(os.path.dirname(target) if os.path.isdir(os.path.dirname(target)) else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if not name or len(os.fsencode(name)) > limit:
        raise CheckpointError(f"path: expected a folder name of 1 to {limit} bytes, got {len(os.fsencode(name))} ({name[:40]!r}...)")


def _check_shard_size(max_shard_size) -> None:
    from transformers.utils.hub import convert_file_size_to_int

    try:
        ok = (isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool) and max_shard_size > 0) or (
            isinstance(max_shard_size, str) and convert_file_size_to_int(max_shard_size) > 0)
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"max_shard_size: expected a positive int of bytes or a size like '5GB', got {max_shard_size!r}")


def _require_real_weights(model: nn.Module) -> None:
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type == "meta":
            raise CheckpointError(f"model: expected real weights, got {name} on the meta device (nothing to save)")


def save_quantized(model: nn.Module, path: str | os.PathLike, tokenizer=None, overwrite: bool = False,
                   max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE) -> str:
    """Save a quantized transformers model (its ``FP8Linear`` modules) as a compressed-tensors checkpoint.

    Args:
        model: a ``transformers.PreTrainedModel`` quantized in place (``quantize_model`` or
            ``FP8Linear.from_linear``); every ``FP8Linear`` records its scheme.
        path: target folder; it must not exist or be empty unless ``overwrite=True``. Its name may
            be up to NAME_MAX (255) bytes.
        tokenizer: saved alongside (``tokenizer.save_pretrained``) when given.
        overwrite: replace an existing checkpoint folder at ``path`` (``config.json``, weights and only
            checkpoint files, see :data:`CHECKPOINT_FILE_PATTERNS`), in one atomic swap once the new
            checkpoint is complete. Any other non-empty folder is never replaced.
        max_shard_size: largest safetensors shard (``save_pretrained``'s argument).

    Returns:
        the absolute path of the checkpoint folder.

    Raises:
        CheckpointExistsError: ``path`` exists and is not empty, and ``overwrite`` is False or it is not
            a checkpoint folder (nothing is deleted).
        CheckpointError: the model has no FP8Linear, one with invalid tensors, weights on the meta
            device, or ``path``'s name is too long.
        ValueError: ``max_shard_size`` is not a positive size.
        TypeError: ``model`` is not a transformers model.
    """
    if not isinstance(model, nn.Module) or not callable(getattr(model, "save_pretrained", None)):
        raise TypeError(f"model: expected a transformers PreTrainedModel, got {type(model).__name__}")
    target = folder_path(path)
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite: expected True or False, got {overwrite!r}")
    if tokenizer is not None and not callable(getattr(tokenizer, "save_pretrained", None)):
        raise TypeError(f"tokenizer: expected a tokenizer with save_pretrained, got {type(tokenizer).__name__}")
    _check_name(target)
    _check_shard_size(max_shard_size)
    _target_state(target, overwrite)  # refuse early; decided again, under the lock, before the swap
    _require_real_weights(model)
    groups, ignore = quantized_groups(model)
    from .. import __version__
    from .experts import amend_config, save_kwargs  # fused MoE experts, stored per expert (no-op without them)

    groups, ignore = amend_config(model, groups, ignore)

    qc = add_to_config(build_ct_config(groups, ignore, __version__), model)  # FP8 embeddings, in our extras
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        work = swap.new_work_dir(parent)
    except OSError as e:
        raise CheckpointError(f"path: cannot create a folder in {parent!r} ({e.strerror})") from e
    marker = swap.Marker(work, target)
    old_qc = model.config.__dict__.get("quantization_config", _UNSET)
    old_quantizer = model.__dict__.get("hf_quantizer", _UNSET)
    old_tie = _UNSET
    try:
        model.config.quantization_config = qc
        # A model read from GGUF carries transformers' gguf quantizer, which refuses to save; its
        # weights are already dequantized and the FP8 ones are ours, described by ``qc``.
        if old_quantizer is not _UNSET:
            model.hf_quantizer = None
        old_tie = _untie_quantized_head(model)
        model.save_pretrained(work, max_shard_size=max_shard_size, **save_kwargs(model))
        if tokenizer is not None:
            tokenizer.save_pretrained(work)
        from .shards import list_tensors

        list_tensors(work)  # the headers we just wrote parse and cover their files
        _readable_by_others(work)
        _fsync_tree(work)
        with swap.DirLock(parent):
            swap.recover(target)
            marker.remove()
            swap.fsync_dir(work)
            _place(work, target, overwrite)
    except BaseException:
        marker.release()
        if os.path.isdir(work):  # still ours: the swap did not happen
            swap.discard(work, target)
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
