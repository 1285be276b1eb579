"""``FP8Embedding``: an ``nn.Embedding`` replacement whose table is stored in FP8 (e4m3), one scale per row.

State-dict contract (read by :func:`fp8_linear.load_quantized`, docs/checkpoints.md "FP8 embeddings"):

================ ======================================= ============================================
key              dtype / shape                            meaning
================ ======================================= ============================================
``weight``       float8_e4m3fn ``[num_embeddings, dim]``  quantized table (round to nearest)
``weight_scale`` fp32 ``[num_embeddings, 1]``             ``E ~= weight * weight_scale`` (row amax / 448)
================ ======================================= ============================================

The per-row scale is exactly the per-output-channel ``weight_scale`` ``[out, 1]`` of an
``FP8Linear`` with channel weights (``fp8-channel``, ``fp8-dynamic``) whose weight is the same
``[vocab, hidden]`` table, so a model whose ``lm_head`` is tied to its input embedding keeps one FP8
tensor and one scale for both (:func:`tie_to_head`: the two modules hold the same ``Parameter``
objects, as transformers ties the BF16 ones).

The module also holds a zero-element parameter ``dtype_anchor`` of the output dtype, registered first:
transformers reads ``model.dtype`` from the first floating-point parameter (``generate`` builds the
static-cache attention mask in it), which would otherwise be this FP8 table. It follows
``.to(dtype)`` / ``.half()``, decides the output dtype, and is never saved.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ShapeError
from .formats import SCALE_DTYPE
from .quantize import dequantize_fp8, quantize_fp8, validate_scale

#: FP8 format of the table (the one vLLM and compressed-tensors use for weights).
EMBEDDING_FP8 = torch.float8_e4m3fn
#: Output dtypes (the dtype of the model the embedding feeds).
OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Name of the zero-element parameter that carries the output dtype (never saved).
DTYPE_ANCHOR = "dtype_anchor"
#: Integer dtypes accepted as token ids (those ``nn.Embedding`` accepts).
INDEX_DTYPES = (torch.int64, torch.int32)


def _check_size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ShapeError(f"{name}: expected a positive int, got {value!r}")
    return value


def _check_output_dtype(dtype) -> torch.dtype:
    if dtype not in OUTPUT_DTYPES:
        raise TypeError(f"dtype: expected one of torch.bfloat16/float16/float32 (the model's dtype), got {dtype!r}")
    return dtype


class FP8Embedding(nn.Module):
    """``E[ids]`` with the table ``E`` stored as FP8 e4m3 rows and one fp32 scale per row.

    Input: token ids ``[...]`` (int64 or int32, any shape, values in ``[0, num_embeddings)``); output
    ``[..., embedding_dim]`` in the output dtype (``dtype_anchor.dtype``: bf16, fp16 or fp32), each row
    ``(weight[i].float() * weight_scale[i]).to(dtype)``: one rounding, from the exact fp32 product.
    ``padding_idx`` is kept as ``nn.Embedding`` keeps it (its row is whatever the table holds: zeros
    quantize to zeros). The forward gathers the FP8 rows (as bytes) before converting, so it reads
    ``T * dim`` bytes for ``T`` tokens and converts nothing else; it has no host sync and no Python
    state, so ``torch.compile(fullgraph=True)`` traces it with no graph break. Ids out of range raise
    as ``nn.Embedding`` does (``IndexError`` on the CPU, a device-side assert on CUDA).

    ``.to(dtype)`` / ``.half()`` leave the FP8 table and the fp32 scales as they are and change the
    output dtype; device moves apply to everything. ``load_state_dict`` refuses a table of another
    dtype and non-positive or non-finite scales, naming the tensor.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 dtype: torch.dtype = torch.bfloat16, device=None):
        super().__init__()
        self.num_embeddings = _check_size("num_embeddings", num_embeddings)
        self.embedding_dim = _check_size("embedding_dim", embedding_dim)
        if padding_idx is not None:
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) or not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"padding_idx: expected an int in [{-num_embeddings}, {num_embeddings}) or None, got {padding_idx!r}")
            padding_idx = padding_idx % num_embeddings  # as nn.Embedding normalizes it
        self.padding_idx = padding_idx
        kw = dict(device=device)
        # registered first: transformers' ``model.dtype`` is the first floating-point parameter's
        self.dtype_anchor = nn.Parameter(torch.empty(0, dtype=_check_output_dtype(dtype), **kw), requires_grad=False)
        self.weight = nn.Parameter(torch.zeros(num_embeddings, embedding_dim, dtype=EMBEDDING_FP8, **kw), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.ones(num_embeddings, 1, dtype=SCALE_DTYPE, **kw), requires_grad=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, dtype: torch.dtype | None = None) -> "FP8Embedding":
        """Quantize an ``nn.Embedding`` (table ``[num_embeddings, dim]``, any float dtype, any device):
        per-row min-max scales ``amax / 448`` (floored at ``MIN_SCALE``: an all-zero row stays zero),
        round to nearest e4m3. ``dtype``: the output dtype (default: the table's, which must then be
        bf16/fp16/fp32).

        Raises ``TypeError`` for anything but a plain ``nn.Embedding`` (a subclass may change the
        forward, e.g. Gemma's scaled embeddings; ``max_norm`` would renormalize the table in place,
        refused as ``ValueError``) and ``ValueError`` for NaN / inf in the table.
        """
        if type(embedding) is not nn.Embedding:
            raise TypeError(f"embedding: expected a torch.nn.Embedding (not a subclass), got {type(embedding).__name__}")
        if embedding.max_norm is not None:
            raise ValueError(f"embedding: max_norm={embedding.max_norm} renormalizes the table at lookup; expected None")
        w = embedding.weight.detach()
        dtype = w.dtype if dtype is None else dtype
        _check_output_dtype(dtype)
        if not torch.isfinite(w).all():
            raise ValueError(f"embedding.weight: expected finite values, got NaN/inf in a {list(w.shape)} table")
        mod = cls(embedding.num_embeddings, embedding.embedding_dim, embedding.padding_idx, dtype, device=w.device)
        q, s = quantize_fp8(w.float(), EMBEDDING_FP8, "channel")
        mod.weight.data.copy_(q)
        mod.weight_scale.data.copy_(s.reshape(mod.weight_scale.shape))
        return mod

    # ------------------------------------------------------------------ forward
    @property
    def output_dtype(self) -> torch.dtype:
        """The dtype of the looked-up rows (that of :data:`DTYPE_ANCHOR`)."""
        return self._parameters[DTYPE_ANCHOR].dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` int64/int32 ids -> ``[..., embedding_dim]`` rows in :attr:`output_dtype`."""
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids: expected a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dtype not in INDEX_DTYPES:
            raise TypeError(f"input_ids: expected dtype int64 or int32 (token ids), got {input_ids.dtype}")
        p = self._parameters
        w, s = p["weight"], p["weight_scale"]
        if input_ids.device != w.device:
            raise ValueError(f"input_ids: expected device {w.device} (that of weight), got {input_ids.device}")
        rows = F.embedding(input_ids, w.view(torch.uint8)).view(w.dtype)  # bytes: every backend gathers uint8
        scale = F.embedding(input_ids, s)  # [..., 1]
        return (rows.to(SCALE_DTYPE) * scale).to(p[DTYPE_ANCHOR].dtype)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``weight * weight_scale`` ``[num_embeddings, dim]`` in ``dtype`` (the table the lookup reads)."""
        return dequantize_fp8(self.weight, self.weight_scale, dtype)

    # ------------------------------------------------------------------ housekeeping
    def check(self) -> None:
        """Validate the tensors: an e4m3 table ``[num_embeddings, dim]``, finite positive fp32 row scales
        ``[num_embeddings, 1]`` (``TypeError`` / :class:`ShapeError` / :class:`ScaleError`)."""
        if self.weight.dtype != EMBEDDING_FP8:
            raise TypeError(f"weight: expected dtype {EMBEDDING_FP8}, got {self.weight.dtype}")
        if tuple(self.weight.shape) != (self.num_embeddings, self.embedding_dim):
            raise ShapeError(f"weight: expected shape [{self.num_embeddings}, {self.embedding_dim}], got {list(self.weight.shape)}")
        validate_scale(self.weight_scale, (self.num_embeddings, 1), "weight_scale")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.pop(prefix + DTYPE_ANCHOR, None)  # carries a dtype, no data: never saved

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        """``load_state_dict`` copies only an e4m3 table and finite positive row scales of the right
        shapes (a copy would otherwise cast a bf16 table to FP8 silently); the error names the tensor."""
        for pname, shape in (("weight", (self.num_embeddings, self.embedding_dim)), ("weight_scale", (self.num_embeddings, 1))):
            key = prefix + pname
            t = state_dict.get(key)
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{key}: expected a torch.Tensor, got {type(t).__name__}")
            if pname == "weight":
                if t.dtype != EMBEDDING_FP8:
                    raise TypeError(f"{key}: expected dtype {EMBEDDING_FP8}, got {t.dtype}")
                if tuple(t.shape) != shape:
                    raise ShapeError(f"{key}: expected shape {list(shape)}, got {list(t.shape)}")
            elif t.device.type != "meta":
                validate_scale(t, shape, key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if prefix + DTYPE_ANCHOR in missing_keys:
            missing_keys.remove(prefix + DTYPE_ANCHOR)

    def _apply(self, fn, recurse=True):
        fp8 = {id(self._parameters[k]) for k in ("weight", "weight_scale")}  # keep their dtypes, follow device moves

        def moved(t):
            out = fn(t)
            changed = id(t) in fp8 and isinstance(out, torch.Tensor) and out.dtype != t.dtype
            return t.to(device=out.device) if changed else out

        out = super()._apply(moved, recurse)
        if self.output_dtype not in OUTPUT_DTYPES:  # e.g. .double(): refused, the anchor put back
            bad = self.output_dtype
            self._parameters[DTYPE_ANCHOR] = nn.Parameter(torch.empty(0, dtype=torch.float32, device=self.weight.device),
                                                          requires_grad=False)
            raise TypeError(f"dtype: FP8Embedding outputs bfloat16/float16/float32, got a conversion to {bad} "
                            "(the output dtype is now float32)")
        return out

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return (f"{self.num_embeddings}, {self.embedding_dim}{pad}, format=e4m3, "
                f"weight_scale=channel{list(self.weight_scale.shape)}, output_dtype={self.output_dtype}")


def shares_weights(embedding: nn.Module, head: nn.Module) -> bool:
    """True when ``embedding`` (an :class:`FP8Embedding`) and ``head`` (an ``FP8Linear``) hold the same
    ``weight`` and ``weight_scale`` parameters (a tied model's one FP8 table)."""
    ep, hp = getattr(embedding, "_parameters", {}), getattr(head, "_parameters", {})
    return (isinstance(embedding, FP8Embedding) and ep.get("weight") is not None
            and ep.get("weight") is hp.get("weight") and ep.get("weight_scale") is hp.get("weight_scale"))


def tie_to_head(embedding: FP8Embedding, head: nn.Module) -> FP8Embedding:
    """Make ``embedding`` use ``head``'s FP8 ``weight`` ``[vocab, hidden]`` and per-channel ``weight_scale``
    ``[vocab, 1]`` (the same ``Parameter`` objects: one table in memory and in a checkpoint), and return it.

    ``head``: an ``FP8Linear`` with e4m3 per-channel weights of shape ``[num_embeddings, embedding_dim]``
    and no bias (a ``ValueError`` names what differs). The two then read one tensor: a function that
    replaces one module's parameter unties them.
    """
    from .module import FP8Linear

    if not isinstance(embedding, FP8Embedding):
        raise TypeError(f"embedding: expected an FP8Embedding, got {type(embedding).__name__}")
    if not isinstance(head, FP8Linear):
        raise TypeError(f"head: expected an FP8Linear, got {type(head).__name__}")
    why = []
    if head.scheme.weight_granularity != "channel":
        why.append(f"weights per {head.scheme.weight_granularity} (scheme {head.scheme.name}), not per channel")
    if head.weight.dtype != EMBEDDING_FP8:
        why.append(f"weight dtype {head.weight.dtype}, not {EMBEDDING_FP8}")
    if (head.out_features, head.in_features) != (embedding.num_embeddings, embedding.embedding_dim):
        why.append(f"weight [{head.out_features}, {head.in_features}], not [{embedding.num_embeddings}, {embedding.embedding_dim}]")
    if head.bias is not None:
        why.append("a bias")
    if why:
        raise ValueError(f"head: cannot share its FP8 weight with the embedding: it has {'; '.join(why)}")
    embedding._parameters["weight"] = head._parameters["weight"]
    embedding._parameters["weight_scale"] = head._parameters["weight_scale"]
    return embedding


def unsaved_parameters(model: nn.Module) -> set[str]:
    """Qualified names of the parameters of ``model`` that no checkpoint holds (each
    :class:`FP8Embedding`'s ``dtype_anchor``)."""
    return {f"{n}.{DTYPE_ANCHOR}" if n else DTYPE_ANCHOR for n, m in model.named_modules(remove_duplicate=False)
            if isinstance(m, FP8Embedding)}


__all__ = ["FP8Embedding", "EMBEDDING_FP8", "DTYPE_ANCHOR", "shares_weights", "tie_to_head", "unsaved_parameters"]
