"""The benchmarks' calls into our kernel and into ``fp8_gemm``'s dispatch, in one place.

Each builder returns a zero-argument callable that launches one GEMM into a preallocated output
(nothing allocated per call, so it can be captured in a CUDA graph).
"""

from __future__ import annotations

import torch

#: Output dtype of every benchmark (docs/design.md section 7).
OUT_DTYPE = torch.bfloat16


def kernels():
    """``fp8_linear.kernels`` (the CUDA extension builds on the first launch)."""
    import fp8_linear.kernels as kern

    return kern


def config_label(cfg) -> str:
    """A kernel config's name where it has one, else its id."""
    return str(getattr(cfg, "name", None) or cfg.id)


def resolve_config(token: str):
    """The kernel config named ``token`` (a config id or name); ``ValueError`` listing the known ones."""
    kern = kernels()
    for cfg in kern.CONFIGS:
        if token == str(cfg.id) or token == getattr(cfg, "name", None):
            return cfg
    raise ValueError(f"--configs: unknown config {token!r}; expected one of {[config_label(c) for c in kern.CONFIGS]}")


def chosen(m: int, n: int, k: int, scale_a: torch.Tensor, out_dtype: torch.dtype = OUT_DTYPE,
           block: bool = False) -> str:
    """What the kernel's own choice runs for this launch (``block``: with 1x128 / 128x128 scales): the
    config and, where K is split, the factor."""
    kern = kernels()
    try:
        extra = {"block": True} if block else {}
        cfg = kern.select_config(m, n, k, swap_ok=kern.swap_ok(scale_a, out_dtype) and not block, **extra)
        splits = kern.select_splits(cfg, m, n, k)
    except Exception as e:  # noqa: BLE001 - the table says so instead of stopping the run
        return f"? ({type(e).__name__})"
    return config_label(cfg) + (f" split{splits}" if splits > 1 else "")


def ours_call(a, b, scale_a, scale_b, config=None, splits: int | None = None, out_dtype=OUT_DTYPE):
    """Our kernel on ``a`` [M, K], ``b`` [N, K] (FP8) with per-tensor ``[1]`` or per-row ``[rows]``
    / ``[rows, 1]`` fp32 scales, or fine-grained ones (1x128 ``[M, ceil(K/128)]`` with 128x128
    ``[ceil(N/128), ceil(K/128)]``, kept 2-D: the block-scaled instances); ``config`` a config (``None``:
    the kernel's choice), ``splits`` a split-K factor (``None``: the kernel's choice, 1: off)."""
    kern = kernels()
    out = torch.empty(a.shape[0], b.shape[0], device=a.device, dtype=out_dtype)
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    block = kern.is_block_scaled(scale_a, scale_b, m, n, k)
    sa, sb = (scale_a, scale_b) if block else (scale_a.reshape(-1), scale_b.reshape(-1))
    cid = -1 if config is None else config.id
    return lambda: kern.sm90_gemm_out(a, b, sa, sb, None, out, cid, False, splits)


def ours_block_call(a, b, scale_a, scale_b, out_dtype=OUT_DTYPE):
    """Our kernel on 1x128 ``scale_a`` ``[M, ceil(K/128)]`` and 128x128 ``scale_b``
    ``[ceil(N/128), ceil(K/128)]``, timed as :func:`ours_call` times the per-tensor launch (the kernel
    package's own config choice into a preallocated output: no per-call Python dispatch, which would make
    the small shapes host-bound in steady-state timing), if ``fp8_gemm``'s dispatch gives the problem to
    the sm90 backend. Returns ``(callable, "sm90")`` or ``(None, reason)``."""
    try:
        from fp8_linear.backends import candidates
        from fp8_linear.gemm import make_problem

        problem = make_problem(a, b, scale_a, scale_b, None, out_dtype)
        verdicts = {name: (ok, why) for name, ok, why in candidates(problem)}
    except Exception as e:  # noqa: BLE001 - reported in the table, not fatal
        return None, f"cannot ask the backends: {type(e).__name__}: {e}"[:160]
    ok, why = verdicts.get("sm90", (False, "no sm90 backend"))
    if not ok:
        return None, f"sm90 refuses: {why}"
    import fp8_linear.kernels as kern

    out = torch.empty(a.shape[0], b.shape[0], device=a.device, dtype=out_dtype)
    sa, sb = problem.scale_a, problem.scale_b
    return (lambda: kern.sm90_gemm_out(a, b, sa, sb, None, out)), "sm90"
