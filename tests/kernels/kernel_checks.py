"""Launch-and-check helpers shared by the sm90 GPU tests: a launch into a NaN-poisoned output, and the
calc_diff bar of docs/design.md section 7 (1.05 x the output dtype's rounding error + 1e-8)."""

from __future__ import annotations

import torch
from helpers import KERNEL_FLOOR, calc_diff, rounding_bar


def run_poisoned(kern, a, b, sa, sb, bias, out_dtype, config=-1, direct_store=False, splits=None, flatten=True):
    """``kern.sm90_gemm_out`` into a NaN-filled ``[M, N]`` output of ``out_dtype`` (synchronized).
    ``flatten``: pass per-tensor / per-row scales as 1-D (``[1]``, ``[rows]``); False passes them as they
    are (fine-grained ``[M, ceil(K/128)]`` / ``[ceil(N/128), ceil(K/128)]``)."""
    out = torch.full((a.shape[0], b.shape[0]), float("nan"), device=a.device, dtype=out_dtype)
    if flatten:
        sa, sb = sa.reshape(-1), sb.reshape(-1)
    kern.sm90_gemm_out(a, b, sa, sb, bias, out, config, direct_store, splits)
    torch.cuda.synchronize()
    return out


def check(out, ref, out_dtype, what=""):
    """Every output written (finite) and calc_diff(out, ref) within the bar; returns the calc_diff."""
    assert torch.isfinite(out).all(), f"{what}: non-finite (unwritten) outputs: {(~torch.isfinite(out)).sum().item()}"
    d = calc_diff(out, ref)
    bar = rounding_bar(ref, out_dtype, KERNEL_FLOOR)
    assert d <= bar, f"{what}: calc_diff {d:.3e} > bar {bar:.3e}"
    return d
