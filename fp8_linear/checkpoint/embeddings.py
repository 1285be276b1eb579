"""FP8 input embeddings (:class:`~fp8_linear.embedding.FP8Embedding`) in our checkpoints.

compressed-tensors has no FP8 embedding, so the table is stored as an FP8Linear weight would be
(``<name>.weight`` F8_E4M3 ``[vocab, hidden]``, ``<name>.weight_scale`` F32 ``[vocab, 1]``) and
listed under our extras key of the ``quantization_config`` (which compressed-tensors ignores)::

    "fp8_linear": {"version": ..., "schemes": {...},
                   "embeddings": {"model.embed_tokens": {"format": "e4m3", "weight_scale": "channel",
                                                         "shares_weight_with": "lm_head"}}}

``shares_weight_with`` names the FP8 ``lm_head`` that holds the same table (a tied model: one
tensor in the file, ``tie_word_embeddings`` kept true), or is ``null``. :func:`swap_embeddings` puts
meta :class:`FP8Embedding` modules in place at load, before the headers are checked; the loader
then checks and reads their tensors as it does an FP8Linear's (through :class:`EmbeddingSlot`).
docs/checkpoints.md says what other readers make of such a file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..embedding import FP8Embedding, shares_weights, tie_to_head
from ..errors import CheckpointError, FP8LinearError
from ..module import FP8Linear
from .ct_config import EXTRAS_KEY
from .fields import fail
from .values import nonfinite_fp8

FIELD = "embeddings"
FORMAT, SCALE_KIND = "e4m3", "channel"
ENTRY_KEYS = ("format", "weight_scale", "shares_weight_with")
WHERE = f"config.json quantization_config.{EXTRAS_KEY}.{FIELD}"


def embeddings_config(model: nn.Module) -> dict:
    """``{name: entry}`` of the model's FP8Embedding modules (empty without them), each checked as a
    save requires (:class:`CheckpointError` naming the module otherwise)."""
    heads = {id(m): n for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    out = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, FP8Embedding):
            continue
        try:
            mod.check()
        except (FP8LinearError, TypeError, ValueError) as e:
            raise CheckpointError(f"model.{name}: cannot save an invalid FP8Embedding ({e})") from e
        bad, first = nonfinite_fp8(mod.weight, FORMAT)
        if bad:
            raise CheckpointError(f"model.{name}.weight: expected finite {FORMAT} values, got {bad} NaN entries "
                                  f"(first at flat index {first}); nothing was saved")
        head = next((n for n, m in model.named_modules() if id(m) in heads and shares_weights(mod, m)), None)
        out[name] = {"format": FORMAT, "weight_scale": SCALE_KIND, "shares_weight_with": head}
    return out


def add_to_config(qc: dict, model: nn.Module) -> dict:
    """``qc`` (a ``quantization_config`` of ``build_ct_config``) with the model's FP8 embeddings listed
    under ``qc[EXTRAS_KEY][FIELD]`` (unchanged when it has none)."""
    entries = embeddings_config(model)
    if entries:
        qc[EXTRAS_KEY][FIELD] = entries
    return qc


def read_config(qc: dict) -> dict[str, str | None]:
    """``{embedding name: name of the FP8 lm_head sharing its table, or None}`` from a stored
    ``quantization_config`` (empty when it lists none); every field type-checked."""
    extras = qc.get(EXTRAS_KEY) if isinstance(qc, dict) else None
    entries = extras.get(FIELD) if isinstance(extras, dict) else None
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        raise fail(WHERE, "an object of {module name: entry}", entries)
    out = {}
    for name, entry in entries.items():
        where = f"{WHERE}.{name}"
        if not isinstance(entry, dict) or set(entry) != set(ENTRY_KEYS):
            raise fail(where, f"an object with exactly the keys {list(ENTRY_KEYS)}", entry)
        if entry["format"] != FORMAT:
            raise fail(f"{where}.format", repr(FORMAT), entry["format"])
        if entry["weight_scale"] != SCALE_KIND:
            raise fail(f"{where}.weight_scale", repr(SCALE_KIND), entry["weight_scale"])
        share = entry["shares_weight_with"]
        if share is not None and (not isinstance(share, str) or not share):
            raise fail(f"{where}.shares_weight_with", "a module name or null", share)
        out[name] = share
    return out


@dataclass(frozen=True)
class _EmbeddingScheme:
    """What the loader's checks read of a scheme, for an FP8 embedding (e4m3 rows, no activations)."""

    name: str = "fp8-embedding"
    fmt: str = FORMAT
    weight_granularity: str = SCALE_KIND
    static: bool = False


class EmbeddingSlot:
    """An :class:`FP8Embedding` as the loader sees an ``FP8Linear`` while it checks and reads tensors:
    an ``[out, in]`` = ``[num_embeddings, dim]`` e4m3 weight with a per-channel scale, no bias, no
    input scale."""

    scheme = _EmbeddingScheme()
    bias = None
    input_scale = None

    def __init__(self, module: FP8Embedding):
        self.module = module
        self.out_features, self.in_features = module.num_embeddings, module.embedding_dim

    @property
    def weight_scale(self) -> torch.Tensor:
        return self.module.weight_scale

    def check(self) -> None:
        self.module.check()


def swap_embeddings(model: nn.Module, qc: dict, swapped: dict, dtype: torch.dtype | None) -> list[str]:
    """Replace each ``nn.Embedding`` the config lists by a meta :class:`FP8Embedding` (output dtype
    ``dtype``, or the model's embedding dtype when ``None``), tied to its ``lm_head`` where it shares
    one, and add an :class:`EmbeddingSlot` for it to ``swapped`` (the loader's ``{name: FP8 module}``).
    Returns the names. :class:`CheckpointError` for a listed module that is not an ``nn.Embedding`` of
    the model, or a head that is not an FP8Linear that can share the table."""
    listed = read_config(qc)
    for name, share in listed.items():
        try:
            emb = model.get_submodule(name)
        except AttributeError:
            emb = None
        if type(emb) is not nn.Embedding:
            raise CheckpointError(f"{WHERE}.{name}: expected an nn.Embedding of the model, got "
                                  f"{type(emb).__name__ if emb is not None else 'no such module'}")
        out_dtype = dtype or emb.weight.dtype
        new = FP8Embedding(emb.num_embeddings, emb.embedding_dim, emb.padding_idx, out_dtype, device="meta")
        new.dtype_anchor = nn.Parameter(torch.empty(0, dtype=out_dtype), requires_grad=False)  # real: carries no data
        if share is not None:
            head = swapped.get(share)
            try:
                tie_to_head(new, head)
            except (TypeError, ValueError) as e:
                raise CheckpointError(f"{WHERE}.{name}.shares_weight_with: {share!r}: {e}") from e
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        swapped[name] = EmbeddingSlot(new)
    return list(listed)


__all__ = ["FIELD", "EmbeddingSlot", "add_to_config", "embeddings_config", "read_config", "swap_embeddings"]
