"""Calibration and evaluation data in every form users already have, turned into token batches.

Accepted forms (docs/design.md section 3):

- ``None``: the embedded default corpus (``pydoc_data.topics``, real English that ships with Python),
  calibration split (needs a tokenizer);
- a string, or a list / iterable of strings (needs a tokenizer); each string is one sample;
- token ids: a 1-D ``[T]`` or 2-D ``[B, T]`` integer tensor, a list of ints, or an iterable of those;
- mappings with ``input_ids`` (and optionally ``attention_mask``), or with ``text`` (needs a tokenizer);
- a ``torch.utils.data.DataLoader`` yielding any of the above (batched or not);
- a ``datasets.Dataset`` (or anything iterable yielding row dicts; read duck-typed, so the
  ``datasets`` package is not needed to pass one).

Everything becomes :class:`Batch` es: ``input_ids`` ``[B, T]`` int64 and ``attention_mask`` ``[B, T]``
int64 (1 = real token, 0 = padding), right-padded, at most ``seq_len`` tokens per sample.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from fp8_linear.errors import CalibrationError

log = logging.getLogger(__name__)

#: Share of the default corpus (by characters, cut at topic boundaries) used for calibration;
#: the rest is the evaluation split. The two never overlap.
CALIB_FRACTION = 0.6
DEFAULT_MAX_SAMPLES = 32
DEFAULT_SEQ_LEN = 512
DEFAULT_BATCH_SIZE = 4
#: ``choose`` and ``report`` halve the eval split (whole topics): defaults are chosen on ``choose`` and
#: reported on ``report``, so a reported number never comes from text a default was tuned on.
SPLITS = ("calib", "eval", "choose", "report")


@dataclass
class Batch:
    """One batch of token ids: ``input_ids`` and ``attention_mask``, both ``[B, T]`` int64."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return int(self.attention_mask.sum())


def corpus_text(split: str = "calib") -> str:
    """The embedded default corpus: ``pydoc_data.topics`` joined in sorted-key order.

    ``split="calib"`` gives the first :data:`CALIB_FRACTION` of it (whole topics), ``"eval"`` the
    rest, ``"choose"`` / ``"report"`` the first / second half of ``"eval"`` (by characters, cut at
    topic boundaries), ``"all"`` everything. Calibration and evaluation text never overlap.
    """
    from pydoc_data.topics import topics

    if split not in SPLITS + ("all",):
        raise ValueError(f"split: expected one of {SPLITS + ('all',)}, got {split!r}")
    keys = sorted(topics)
    if split == "all":
        return "\n\n".join(topics[k] for k in keys)
    total = sum(len(topics[k]) for k in keys)
    calib, seen = [], 0
    for k in keys:
        if seen >= CALIB_FRACTION * total:
            break
        calib.append(k)
        seen += len(topics[k])
    chosen = calib if split == "calib" else keys[len(calib):]
    if split in ("choose", "report"):
        rest, half, seen = chosen, sum(len(topics[k]) for k in chosen) / 2, 0
        cut = next((i for i, k in enumerate(rest) if (seen := seen + len(topics[k])) >= half), len(rest) - 1) + 1
        chosen = rest[:cut] if split == "choose" else rest[cut:]
    return "\n\n".join(topics[k] for k in chosen)


def text_windows(text: str, tokenizer, seq_len: int, max_windows: int | None = None) -> list[torch.Tensor]:
    """Tokenize ``text`` once and cut it into consecutive, non-overlapping windows of ``seq_len``
    token ids (1-D int64 each; a final partial window is dropped unless it is the only one)."""
    _require_tokenizer(tokenizer, "text")
    ids = torch.as_tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long).flatten()
    n = max(ids.numel() // seq_len, 1 if ids.numel() else 0)
    if max_windows is not None:
        n = min(n, max_windows)
    return [ids[i * seq_len: (i + 1) * seq_len] for i in range(n)]


def _require_tokenizer(tokenizer, what: str) -> None:
    if tokenizer is None:
        raise ValueError(f"tokenizer: {what} fp8_linear/calibration/eval data needs a tokenizer, got None")


def _is_ragged(ids) -> bool:
    """True for a list / tuple of rows (lists, tuples or 1-D tensors) of different lengths."""
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(r, (list, tuple, torch.Tensor)) for r in ids):
        return False
    return len({len(r) for r in ids}) > 1


def _rows_from_ids(ids, mask=None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if _is_ragged(ids) or (mask is not None and _is_ragged(mask)):
        # a ragged (unpadded) batch: each row is a sample of its own, padded again when batched
        masks = [None] * len(ids) if mask is None else mask
        if not isinstance(masks, (list, tuple, torch.Tensor)) or len(masks) != len(ids):
            raise ValueError(f"attention_mask: expected one row per input_ids row ({len(ids)}), got {type(masks).__name__}")
        for i, (row, m) in enumerate(zip(ids, masks)):
            if m is not None and len(m) != len(row):
                raise ValueError(f"attention_mask: expected row {i} of length {len(row)} (that of input_ids), got {len(m)}")
            yield from _rows_from_ids(row, m)
        return
    ids = torch.as_tensor(ids)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise TypeError(f"input_ids: expected integer token ids, got dtype {ids.dtype}")
    if ids.device.type == "meta":
        raise ValueError("input_ids: expected token ids with values, got a tensor on the meta device")
    ids = ids.long()
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask).long()
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask: expected shape {list(ids.shape)} (that of input_ids), got {list(mask.shape)}")
    if ids.dim() == 1:
        yield ids, mask
    elif ids.dim() == 2:
        yield from zip(ids, mask)
    else:
        raise ValueError(f"input_ids: expected a 1-D [T] or 2-D [B, T] tensor, got shape {list(ids.shape)}")


def _rows(item, tokenizer, seq_len: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Token rows (1-D ids, 1-D mask) of one item of the user's data."""
    if isinstance(item, str):
        _require_tokenizer(tokenizer, "text")
        enc = tokenizer(item, truncation=True, max_length=seq_len)
        yield from _rows_from_ids(enc["input_ids"], enc.get("attention_mask"))
    elif isinstance(item, torch.Tensor):
        yield from _rows_from_ids(item)
    elif isinstance(item, Mapping):
        if "input_ids" in item:
            yield from _rows_from_ids(item["input_ids"], item.get("attention_mask"))
        elif "text" in item:
            texts = item["text"]
            for t in [texts] if isinstance(texts, str) else texts:
                yield from _rows(t, tokenizer, seq_len)
        else:
            raise ValueError(f"calib_data: expected mappings with 'input_ids' or 'text', got keys {sorted(item)[:8]}")
    elif isinstance(item, (list, tuple)) and item and all(isinstance(v, int) for v in item):
        yield from _rows_from_ids(item)
    elif isinstance(item, (list, tuple)) and item and all(isinstance(v, (list, tuple, torch.Tensor)) for v in item):
        for row in item:  # a batch of rows of possibly different lengths
            yield from _rows(row, tokenizer, seq_len)
    else:
        raise TypeError(
            "calib_data: expected strings, token-id tensors/lists, or mappings with 'input_ids'/'text', "
            f"got an item of type {type(item).__name__}"
        )


def _items(data, tokenizer, seq_len: int, max_samples: int) -> Iterable:
    if data is None:
        _require_tokenizer(tokenizer, "the default corpus as")
        return text_windows(corpus_text("calib"), tokenizer, seq_len, max_samples)
    if isinstance(data, (str, torch.Tensor, Mapping)):
        return [data]
    if isinstance(data, (list, tuple)) and data and all(isinstance(v, int) for v in data):
        return [data]
    if not isinstance(data, Iterable):
        raise TypeError(f"calib_data: expected None, text, token ids, mappings, a DataLoader or a Dataset, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class ModelLimits:
    """What a model accepts as input: token ids in ``[0, vocab_size)``, at most ``max_positions``
    tokens per sample (``None``: no limit known)."""

    vocab_size: int | None
    max_positions: int | None


#: Config fields giving a model's largest position (absolute embeddings; rope models' trained length).
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def require_real_weights(model, name: str = "model") -> None:
    """``ValueError`` naming ``name`` when ``model`` has a parameter or buffer on the meta device."""
    for pname, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        if t.device.type == "meta":
            raise ValueError(f"{name}: expected a model with real weights, got {pname} on the meta device "
                             "(load it with from_pretrained, or materialize it with to_empty and load_state_dict)")


def model_limits(model) -> ModelLimits:
    """The :class:`ModelLimits` of a transformers model (input embedding rows; config position fields)."""
    get_emb = getattr(model, "get_input_embeddings", None)
    emb = get_emb() if callable(get_emb) else None
    vocab = getattr(emb, "num_embeddings", None)
    config = getattr(model, "config", None)
    if not isinstance(vocab, int):
        vocab = getattr(config, "vocab_size", None)
    pos = next((getattr(config, f) for f in POSITION_FIELDS if isinstance(getattr(config, f, None), int)), None)
    return ModelLimits(vocab if isinstance(vocab, int) and vocab > 0 else None, pos if pos and pos > 0 else None)


def check_token_ids(ids: torch.Tensor, mask: torch.Tensor, limits: ModelLimits | None, name: str) -> torch.Tensor:
    """``ids`` with every real token (``mask == 1``) checked against ``[0, vocab_size)`` (``ValueError``
    naming ``name``, the range and the first bad id and position); ids under padding (``mask == 0``)
    outside the range become 0, since the model still embeds them."""
    vocab = limits.vocab_size if limits is not None else None
    bad = (ids < 0) | (ids >= vocab) if vocab is not None else ids < 0
    real = bad & (mask != 0)
    if bool(real.any()):
        pos = int(real.nonzero()[0][-1])
        rng = f"[0, {vocab})" if vocab is not None else ">= 0"
        raise ValueError(f"{name}: expected token ids in {rng} (the model's vocabulary), got {int(ids[pos])} at position {pos}")
    return torch.where(bad, torch.zeros_like(ids), ids) if bool(bad.any()) else ids


def iter_samples(data, tokenizer=None, *, seq_len: int = DEFAULT_SEQ_LEN, max_samples: int = DEFAULT_MAX_SAMPLES,
                 limits: ModelLimits | None = None, name: str = "calib_data") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield at most ``max_samples`` rows ``(input_ids [T], attention_mask [T])`` (int64, ``T <= seq_len``)
    from ``data`` in any accepted form (see the module docstring). Empty rows are skipped.

    With ``limits`` (a model's, :func:`model_limits`): token ids out of the vocabulary are refused
    (``ValueError`` naming ``name``), and rows are cut to the model's ``max_positions`` with a warning."""
    if not isinstance(seq_len, int) or not isinstance(max_samples, int) or seq_len < 1 or max_samples < 1:
        raise ValueError(f"seq_len/max_samples: expected positive ints, got {seq_len!r}/{max_samples!r}")
    cut = seq_len
    if limits is not None and limits.max_positions is not None and limits.max_positions < seq_len:
        cut = limits.max_positions
    warned = False
    rows = (r for item in _items(data, tokenizer, seq_len, max_samples) for r in _rows(item, tokenizer, seq_len))
    rows = ((ids, mask) for ids, mask in rows if ids.numel())
    for ids, mask in itertools.islice(rows, max_samples):
        if ids.numel() > cut and cut < seq_len and not warned:
            log.warning("%s: samples of up to %d tokens cut to %d, the model's max_position_embeddings", name,
                        min(ids.numel(), seq_len), cut)
            warned = True
        ids, mask = ids[:cut], mask[:cut]
        yield check_token_ids(ids, mask, limits, name), mask


def pad_id_of(tokenizer) -> int:
    """The id used for right-padding: the tokenizer's pad, else eos, else 0 (masked out either way)."""
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None) if tokenizer is not None else None
        if isinstance(v, int):
            return v
    return 0


def iter_batches(data, tokenizer=None, *, seq_len: int = DEFAULT_SEQ_LEN, max_samples: int = DEFAULT_MAX_SAMPLES,
                 batch_size: int = DEFAULT_BATCH_SIZE, limits: ModelLimits | None = None,
                 name: str = "calib_data") -> Iterator[Batch]:
    """Group :func:`iter_samples` rows into right-padded :class:`Batch` es of ``batch_size`` rows."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    pad = pad_id_of(tokenizer)
    if pad < 0 or (limits is not None and limits.vocab_size is not None and pad >= limits.vocab_size):
        pad = 0  # a pad id the model cannot embed (masked out either way)
    it = iter_samples(data, tokenizer, seq_len=seq_len, max_samples=max_samples, limits=limits, name=name)
    while chunk := list(itertools.islice(it, batch_size)):
        t = max(ids.numel() for ids, _ in chunk)
        ids = torch.full((len(chunk), t), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), t), dtype=torch.long)
        for i, (r, m) in enumerate(chunk):
            ids[i, : r.numel()] = r
            mask[i, : m.numel()] = m
        yield Batch(ids, mask)


def materialize_batches(data, tokenizer=None, *, name: str = "calib_data", model=None, **kw) -> list[Batch]:
    """:func:`iter_batches` as a list; :class:`CalibrationError` (naming the argument ``name``) if there
    is no real token at all.

    With ``model``: a model on the meta device is refused (``ValueError``), token ids are checked
    against its vocabulary and samples cut to its positions (see :func:`iter_samples`)."""
    limits = None
    if model is not None:
        require_real_weights(model)
        limits = model_limits(model)
    batches = list(iter_batches(data, tokenizer, limits=limits, name=name, **kw))
    if not batches or sum(b.num_tokens for b in batches) == 0:
        raise CalibrationError(
            f"{name}: expected at least one non-padding token, got {len(batches)} batch(es) "
            f"with {sum(b.num_tokens for b in batches)} real tokens"
        )
    return batches
