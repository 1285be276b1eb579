"""GPTQ-style error compensation for FP8 weights (optional; ``quantize_model(..., gptq=True)``).

Rounding each weight to the FP8 grid independently leaves an output error ``(W_q - W) x``. GPTQ
(Frantar et al., 2022) quantizes the input columns one at a time and spreads each column's rounding
error over the columns not yet quantized, weighted by the inverse of ``H = sum x x^T`` (the layer's
input second moment), which minimizes ``||(W_q - W) X||^2`` greedily. The scales stay those of the
scheme (per-tensor, per-channel or 128x128 blocks), so the result is an ordinary FP8 checkpoint.

Speed (a 2-core CPU quantizes SmolLM2-135M with every preset in one pass):

- the factor ``U`` (upper Cholesky factor of the dampened ``H^-1``) depends on ``H`` only; it is
  computed once per distinct layer input (:meth:`HessianAccumulator.inverse_factor`, memoized) with
  one Cholesky and one triangular inverse (``torch.cholesky_inverse`` is ~20x slower on CPU);
- rows are independent, so every layer sharing one input (q/k/v, gate/up) and every weight recipe
  (per-tensor, per-channel, block scales of several presets) are stacked into one ``[rows, in]``
  problem: one column sweep per distinct ``H`` instead of one per layer and preset
  (:func:`gptq_fp8_many`).

Column order ("act-order", as in the GPTQ reference code's ``--act-order``): columns are quantized
in order of decreasing ``H[i, i]`` (the inputs with the most energy first), so the error of the
large-input columns is spread over the many columns that follow instead of the few that remain.
On by default (:data:`ACT_ORDER`; every function here takes ``act_order``), with ``H`` from every
calibration token (:data:`MAX_TOKENS` ``None``): on SmolLM2-135M, measured on three texts neither
the calibration nor the choice of a default saw, the two together lower KL against the unquantized
model by 5-9% (fp8-channel) and 9-14% (fp8-tensor) compared with the natural order and ``H`` from 4096
tokens (docs/calibration.md, ``benchmarks/calibration_ablation.py``). The earlier recipe is
``act_order=False, hessian_tokens=4096`` (``quantize_model``, ``compare_schemes``).

Memory: one ``[in, in]`` fp64 matrix (plus its factor) per distinct layer input.
Memory: one ``[in, in]`` fp64 matrix (plus its factor) per distinct layer input.
"""

from __future__ import annotations

import torch

from fp8_linear.formats import SCALE_DTYPE, fmt_max, resolve_format
from fp8_linear.quantize import expand_scale

from .observers import single_thread

#: Relative dampening added to H's diagonal (as in GPTQ), for a well-conditioned inverse.
DAMP = 0.01
#: Columns processed per lazy-update block.
BLOCK = 32
#: Tokens folded into each H when a caller passes ``max_tokens=None``: ``None`` = every calibration
#: token (accumulating H costs 2 * in^2 flops per token and layer input, about as much as the forward
#: pass itself for SmolLM2). An int caps it (the earlier default was 4096).
MAX_TOKENS: int | None = None
#: Quantize columns in order of decreasing ``H[i, i]`` when a caller passes ``act_order=None`` (see the
#: module docstring: lower KL on every unseen text measured, with ``H`` from every token).
ACT_ORDER = True


def check_token_cap(value, name: str = "max_tokens") -> None:
    """Raise ``ValueError`` unless ``value`` is ``None`` (no cap) or a positive int (tokens per ``H``)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name}: expected a positive number of tokens or None (every token), got {value!r}")


class HessianAccumulator:
    """``H = sum x x^T`` (fp64 ``[in, in]``) over the input rows ``x`` ``[tokens, in]``: every row, or at
    most ``max_tokens`` (``None``: :data:`MAX_TOKENS`, read when the accumulator is made; ``None`` there
    too = no cap)."""

    def __init__(self, in_features: int, max_tokens: int | None = None, device: torch.device | str | None = None):
        self.h = torch.zeros(in_features, in_features, dtype=torch.float64, device=device)
        self.tokens = 0
        check_token_cap(max_tokens)
        self.max_tokens = MAX_TOKENS if max_tokens is None else max_tokens  # read at call time
        self._factor: tuple | None = None  # (tokens, damp, act_order, U, dead, perm), see inverse_factor

    def update(self, x: torch.Tensor) -> None:
        """Fold the rows of ``x`` (``[tokens, in]``, any device: ``H`` moves to it on the first update)
        into ``H`` (up to ``max_tokens`` in total when it is set). On CUDA, bf16/fp16 inputs are multiplied in TF32,
        which holds them exactly (exact products, fp32 sums); fp32 inputs in full fp32."""
        x = x.reshape(-1, x.shape[-1])
        if self.max_tokens is not None:
            room = self.max_tokens - self.tokens
            if room <= 0:
                return
            x = x[:room]
        if self.tokens == 0 and self.h.device != x.device:
            self.h = self.h.to(x.device)
        exact_in_tf32 = x.dtype in (torch.bfloat16, torch.float16)  # 7 / 10 mantissa bits: TF32 holds them
        x = x.to(torch.float32)
        if x.is_cuda and exact_in_tf32:
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                self.h.add_(x.t() @ x)  # fp32 -> fp64 inside the add: no fp64 temporary
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev
        else:
            self.h.add_(x.t() @ x)
        self.tokens += x.shape[0]

    def to(self, device) -> "HessianAccumulator":
        """Move ``H`` (and a memoized factor) to ``device``, in place; returns ``self``."""
        self.h = self.h.to(device)
        if self._factor is not None:
            self._factor = (*self._factor[:3], *(t.to(device) if t is not None else None for t in self._factor[3:]))
        return self

    def inverse_factor(self, damp: float | None = None, act_order: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(U, dead, perm)`` of :func:`column_order_factor` for the current ``H``, computed once and memoized."""
        key = (self.tokens, DAMP if damp is None else damp, ACT_ORDER if act_order is None else act_order)
        if self._factor is None or self._factor[:3] != key:
            self._factor = (*key, *column_order_factor(self.h, damp, key[2]))
        return self._factor[3:]


def column_order_factor(h: torch.Tensor, damp: float | None = None, act_order: bool | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(U, dead, perm)``: the :func:`inverse_factor` of ``h`` with rows and columns in GPTQ's column order.

    Args:
        h: ``sum x x^T``, ``[in, in]`` (fp64).
        damp: dampening, as a fraction of the mean diagonal.
        act_order: order columns by decreasing ``h[i, i]`` (``None`` = :data:`ACT_ORDER`).

    Returns:
        ``U`` fp32 ``[in, in]`` and ``dead`` bool ``[in]`` of the permuted ``h[perm][:, perm]``, and ``perm``
        (int64 ``[in]``, a stable sort), or ``None`` for the natural order.
    """
    if not (ACT_ORDER if act_order is None else act_order):
        return (*inverse_factor(h, damp), None)
    perm = torch.argsort(torch.diagonal(h), descending=True, stable=True)
    return (*inverse_factor(h, damp, perm), perm)


def inverse_factor(h: torch.Tensor, damp: float | None = None, perm: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The GPTQ factor of ``h``: ``U`` upper-triangular with ``U^T U = (H + damp * mean(diag H) * I)^-1``.

    Args:
        h: ``sum x x^T``, ``[in, in]`` (fp64). Inputs that never fire (zero diagonal, "dead") get
            ``H[i, i] = 1`` so the factor exists; their weights are zeroed by the caller.
        damp: dampening, as a fraction of the mean diagonal (``None``: :data:`DAMP`, read at call time).
        perm: int64 ``[in]``: the factor of ``h[perm][:, perm]`` (bitwise), without a permuted copy of
            ``h`` besides the one the factorization needs anyway.

    Returns:
        ``(U, dead)``: ``U`` fp32 ``[in, in]`` upper-triangular, ``dead`` bool ``[in]``.

    With ``P`` the reversal permutation and ``P H P = L L^T`` (Cholesky), ``H = R R^T`` for the upper
    triangular ``R = P L P``, so ``H^-1 = R^-T R^-1`` and ``U = R^-1 = P L^-1 P``: one Cholesky and one
    triangular inverse (``U`` has a positive diagonal, so it *is* the Cholesky factor of ``H^-1``).
    """
    damp = DAMP if damp is None else damp
    dead = torch.diag(h) == 0 if perm is None else torch.diag(h)[perm] == 0
    # GPU memory: besides ``h`` itself at most two [in, in] fp64 matrices are alive at a time (3.1 GiB
    # for Llama-3-8B's 14336-wide down_proj): the flipped copy and the factor, then the factor and the
    # identity that the triangular solve overwrites in place.
    if perm is None:
        h = h.flip(0, 1)  # a copy
    else:  # the permutation and the reversal in one gather: P_rev h[perm][:, perm] P_rev
        rev = perm.flip(0).to(h.device)
        h = h.index_select(0, rev).index_select(1, rev)  # the row gather is freed before the factor
    d = torch.diagonal(h)  # the flip keeps the diagonal on the diagonal, reversed
    d[dead.flip(0)] = 1.0
    d += damp * d.mean()
    low = torch.linalg.cholesky(h)
    del h, d
    # the identity in column-major order (its transpose view): the layout solve_triangular works in, so
    # ``out=`` is solved in place, bitwise as without ``out`` (which copies the identity into a new buffer)
    u = torch.eye(low.shape[0], dtype=low.dtype, device=low.device).t()
    torch.linalg.solve_triangular(low, u, upper=False, out=u)
    del low
    u = u.to(SCALE_DTYPE)  # before the flip: one fp64 [in, in] copy fewer (the two commute exactly)
    return u.flip(0, 1), dead


def gptq_fp8(w: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, fmt: str | torch.dtype = "e4m3",
             damp: float | None = None, block: int = BLOCK, act_order: bool | None = None) -> torch.Tensor:
    """GPTQ-quantize ``w`` onto the FP8 grid of the fixed ``scale``.

    Args:
        w: weight ``[out, in]`` (any float dtype; computed in fp32). Rows are independent, so the
            weights of several layers that share one input (q/k/v, gate/up) can be stacked.
        h: ``sum x x^T`` of the layer's inputs, ``[in, in]`` (fp64), or a :class:`HessianAccumulator`
            (its factor is computed once and reused by later calls).
        scale: the weight scale: ``[1]``, ``[out, 1]``, 128x128 blocks, or already expanded ``[out, in]``; fp32.
        fmt: FP8 format.
        damp: dampening, as a fraction of the mean diagonal of ``h`` (``None``: :data:`DAMP`).
        block: columns per lazy update.
        act_order: quantize columns by decreasing ``h[i, i]`` (``None`` = :data:`ACT_ORDER`).

    Returns:
        fp32 ``[out, in]`` whose every element is ``q * scale`` with ``q`` on the FP8 grid, so that
        quantizing it again with ``scale`` gives ``q`` exactly.
    """
    return gptq_fp8_many([w], h, [scale], fmt, damp, block, act_order)[0]


def gptq_fp8_many(ws: list[torch.Tensor], h, scales: list[torch.Tensor], fmt: str | torch.dtype = "e4m3",
                  damp: float | None = None, block: int = BLOCK, act_order: bool | None = None) -> list[torch.Tensor]:
    """:func:`gptq_fp8` of several weights that share one input (one ``H``), in one column sweep.

    ``ws[i]`` ``[out_i, in]`` is rounded onto the grid of ``scales[i]`` (any shape :func:`gptq_fp8`
    takes); the same weight may appear several times with different scales (one per preset). Each
    result equals what a separate :func:`gptq_fp8` call gives up to fp32 rounding of the shared
    column updates (rows never mix). Returns fp32 ``[out_i, in]`` tensors, in order.
    """
    if len(ws) != len(scales) or not ws:
        raise ValueError(f"ws/scales: expected equally long non-empty lists, got {len(ws)} and {len(scales)}")
    n_in = ws[0].shape[1]
    for i, w in enumerate(ws):
        if w.dim() != 2 or w.shape[1] != n_in:
            raise ValueError(f"ws[{i}]: expected [out, {n_in}], got shape {list(w.shape)}")
    u, dead, perm = h.inverse_factor(damp, act_order) if isinstance(h, HessianAccumulator) else column_order_factor(h, damp, act_order)
    if u.shape[0] != n_in:
        raise ValueError(f"h: expected [{n_in}, {n_in}] (the weights' input width), got {list(u.shape)}")
    dev = u.device  # the sweep runs where H is (a GPU during GPU calibration)
    w = torch.cat([x.detach().to(dev, SCALE_DTYPE) for x in ws])
    s = torch.cat([(sc.to(dev) if sc.shape == x.shape else expand_scale(sc.to(dev), x.shape)).to(SCALE_DTYPE)
                   for x, sc in zip(ws, scales)])
    if perm is not None:  # sweep in the permuted column order, return in the original one
        w, s = w[:, perm], s[:, perm]
    w[:, dead] = 0.0
    out = _sweep(w, s.contiguous(), u, resolve_format(fmt), block)
    if perm is not None:
        out = out[:, torch.argsort(perm)]
    return list(out.split([x.shape[0] for x in ws]))


def _sweep(w: torch.Tensor, s: torch.Tensor, hinv: torch.Tensor, dtype: torch.dtype, block: int) -> torch.Tensor:
    """The GPTQ column sweep over ``w`` ``[rows, in]`` with expanded scales ``s``; returns ``[rows, in]``.

    Works on the transposes (``[in, rows]``: every input column a contiguous row), so each block of
    columns, its scales and its lazy update are contiguous slices rather than strided copies.
    """
    m = fmt_max(dtype)
    n_in = w.shape[1]
    wt = w.t().contiguous()
    st = s.t().contiguous()
    it = torch.reciprocal(st)
    out = torch.empty_like(wt)
    diag_all = torch.diagonal(hinv).tolist()  # one host sync for the sweep, not one per block
    with single_thread():
        for i0 in range(0, n_in, block):
            i1 = min(i0 + block, n_in)
            wb, sb, ib, qb = wt[i0:i1], st[i0:i1], it[i0:i1], out[i0:i1]
            eb = torch.empty_like(wb)
            hb = hinv[i0:i1, i0:i1]
            diag = diag_all[i0:i1]
            for j in range(i1 - i0):
                col, q = wb[j], qb[j]
                torch.mul(col, ib[j], out=q).clamp_(-m, m)
                q.copy_(q.to(dtype)).mul_(sb[j])
                e = torch.sub(col, q, out=eb[j]).div_(diag[j])
                if j + 1 < i1 - i0:
                    wb[j + 1:].addr_(hb[j, j + 1:], e, alpha=-1.0)
            if i1 < n_in:
                wt[i1:].addmm_(hinv[i0:i1, i1:].t(), eb, alpha=-1.0)
    return out.t().contiguous()
