"""Kernel names to categories: the first ``(label, regular expression)`` of a table that matches a GPU
kernel's name (the profiles' tables: :data:`CATEGORIES` for the decode-step and prefill profiles,
``benchmarks.moe_profile.CATEGORIES``), and a profiler's kernels summed by category and by name."""

from __future__ import annotations

import re

import torch


def first_match(name: str, table: tuple[tuple[str, str], ...], default: str = "other") -> str:
    """The label of the first ``(label, pattern)`` in ``table`` whose pattern ``re.search``es ``name``,
    else ``default``."""
    return next((label for label, pattern in table if re.search(pattern, name)), default)


#: Kernel categories, first match wins (regular expressions on the kernel name). Inductor's kernels come
#: before cuBLAS: their fused names carry the ops they feed (``..._sm90_gemm_view_13``, ``..._attention_...``).
CATEGORIES = (
    ("fp8 gemm (ours)", r"fp8_gemm_sm90|grouped_gemm_sm90"),
    ("act quant (ours)", r"quant_rows|quant_groups"),  # the CUDA kernels and the Triton ones
    ("inductor triton", r"^triton_"),
    ("cuBLAS/cuBLASLt gemm", r"nvjet|gemm|gemv|xmma|cutlass|cublas"),
    ("attention", r"flash|fmha|attn|attention|sdpa|efficient"),
    ("copy/fill", r"[Mm]emcpy|[Mm]emset|copy|fill|CatArray"),
)


def category(name: str) -> str:
    """The :data:`CATEGORIES` label of a GPU kernel's name (the first pattern that matches), else ``other``."""
    return first_match(name, CATEGORIES)


def kernel_totals(prof, reps: int = 1) -> tuple[dict, dict, list]:
    """A profiler's GPU kernels summed per call of ``reps``: ``({category: {count, us}}, {kernel name: us},
    [(start, end) of every kernel]``; categories by :func:`category`)."""
    cats: dict[str, dict] = {}
    names: dict[str, float] = {}
    intervals = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        dur = e.time_range.end - e.time_range.start
        c = cats.setdefault(category(e.name), dict(count=0, us=0.0))
        c["count"] += 1 / reps
        c["us"] += dur / reps
        names[e.name] = names.get(e.name, 0.0) + dur / reps
        intervals.append((e.time_range.start, e.time_range.end))
    return cats, names, intervals
