"""The launch plans of the static / per-token row kernels (``fp8_linear/kernels/include/act_quant_plan.h``,
``plan_rows``) and a CPU model of the kernels' index map (``fp8_linear/kernels/csrc/act_quant.cu``:
``quant_rows_kernel``, ``quant_token_cluster_kernel`` and their ``Slots``): the header is compiled with the
host C++ compiler (it is plain C++), its plans over K in 1..140000 and M in 1..4096 are read back, and for
each the model lists the elements every CTA's threads load and store. Every element of a row is covered
exactly once, nothing outside [0, K) is touched, the per-token scale has one writer a row, and each plan
is inside the limits of the kernel it launches (threads, slots, grid, cluster size). Skips without a
compiler."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "fp8_linear" / "kernels"
PLAN_HEADER = KERNELS / "include" / "act_quant_plan.h"

VEC = 8  # elements of a slot (kVec)
MAX_THREADS = 256  # threads of a one-CTA row kernel (kMaxThreads)
CLUSTER_MAX_THREADS = 1024  # threads of a cluster CTA (kClusterMaxThreads)
MAX_CLUSTER = 8  # portable cluster size (kMaxCluster)
CLUSTER_CTA_MAX = 1024  # rows x cluster CTAs (kTokenClusterCtaMax)
MAX_GRID_Y = 65535
#: Largest slot count of the one-CTA kernels (act_quant.cu max_slots): 16-bit vector, fp32 vector, scalar.
MAX_NV = {"vec16": 16, "vec32": 4, "scalar": 4}
CLUSTER_MAX_SLOTS = 2  # kClusterMaxSlots
CLUSTER_MIN_UNITS = 512  # kClusterMinUnits: K <= 4096 stays one CTA a row

PROGRAM = r"""
#include <cstdio>
#include "act_quant_plan.h"
int main() {
  long long rows, K;
  int per_token, vec, max_nv;
  while (std::scanf("%lld %lld %d %d %d", &rows, &K, &per_token, &vec, &max_nv) == 5) {
    const fp8act::RowPlan p = fp8act::plan_rows(rows, K, per_token != 0, vec != 0, max_nv);
    std::printf("%d %d %lld %d %d %lld\n", p.threads, p.slots, (long long)p.spans, int(p.resident), p.cluster,
                (long long)p.span);
  }
  return 0;
}
"""

MS = (1, 2, 7, 16, 100, 128, 129, 256, 257, 512, 513, 1024, 2048, 4096)


def _ks() -> list[int]:
    """K of the plans: 1..2100, the span and cluster boundaries (multiples of 2048, 8 x 1024 x 8 and their
    neighbours), the model shapes and a spread of random K up to 140000."""
    ks = set(range(1, 2101))
    for base in [2048 * i for i in range(1, 70)] + [65536, 131072, 8 * 256 * 8, 8 * 512 * 8]:
        ks.update(base + d for d in (-9, -8, -1, 0, 1, 8, 16))
    ks.update((3584, 4096, 5120, 8192, 8200, 14336, 18944, 28672, 40000, 131080, 140000))
    rng = np.random.default_rng(3)
    ks.update(int(k) for k in rng.integers(1, 140000, 300))
    return sorted(k for k in ks if k >= 1)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """{(rows, K, per_token, kind): (threads, slots, spans, resident, cluster, span)} from the compiled header."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler on this machine")
    d = tmp_path_factory.mktemp("plan")
    src, exe = d / "plan.cpp", d / "plan"
    src.write_text(PROGRAM)
    build = subprocess.run([cxx, "-std=c++17", "-O2", f"-I{PLAN_HEADER.parent}", str(src), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    keys = []
    for k in _ks():
        for m in MS:
            for per_token in (0, 1):
                kinds = ("vec16", "vec32", "scalar") if k % VEC == 0 else ("scalar",)
                keys += [(m, k, per_token, kind) for kind in kinds]
    stdin = "".join(f"{m} {k} {t} {int(kind != 'scalar')} {MAX_NV[kind]}\n" for m, k, t, kind in keys)
    run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(keys)
    return {key: tuple(int(v) for v in line.split()) for key, line in zip(keys, lines)}


def _cluster_enabled() -> bool:
    m = re.search(r"constexpr bool kTokenClusterEnabled = (true|false);", PLAN_HEADER.read_text())
    assert m, "kTokenClusterEnabled not found in act_quant_plan.h"
    return m.group(1) == "true"


def _span_elements(k0: int, length: int, nt: int, nv: int, vec: bool) -> np.ndarray:
    """Elements one CTA of `nt` threads touches in the span [k0, k0 + length) (``Slots::load`` / ``store``):
    vector path, slot j of thread t: the 8 elements from k0 + 8 (j nt + t) when j nt < length / 8 - t;
    scalar path, item i of thread t: element k0 + i nt + t when i nt < length - t."""
    t = np.arange(nt)
    if vec:
        j = np.arange(nv)[:, None]
        unit = j * nt + t[None, :]
        live = j * nt < (length // VEC) - t[None, :]
        starts = k0 + VEC * unit[live]
        return (starts[:, None] + np.arange(VEC)[None, :]).ravel()
    i = np.arange(nv * VEC)[:, None]
    live = i * nt < length - t[None, :]
    return (k0 + i * nt + t[None, :])[live]


def _row_elements(k: int, per_token: bool, vec: bool, plan) -> tuple[list[np.ndarray], int]:
    """Each pass's elements of one row under `plan` (the converting pass last), and the CTAs of the row that
    write its scale (per-token)."""
    threads, slots, spans, resident, cluster, span = plan
    if cluster > 1:  # quant_token_cluster_kernel: CTA y of the cluster holds [y span, (y + 1) span)
        parts = [_span_elements(y * span, max(0, min(k - y * span, span)), threads, slots, True) for y in range(spans)]
        return [np.concatenate(parts)], sum(1 for y in range(spans) if y == 0)  # blockIdx.y == 0 writes s[row]
    if not per_token:  # static: CTA y of the row, span = threads x 8 x slots
        parts = [_span_elements(y * span, min(k - y * span, span), threads, slots, vec) for y in range(spans)]
        return [np.concatenate(parts)], 0
    if resident:  # one CTA, the row in one span
        return [_span_elements(0, k, threads, slots, vec)], 1
    parts = [_span_elements(k0, min(k - k0, span), threads, slots, vec) for k0 in range(0, k, span)]
    both = np.concatenate(parts)
    return [both, both], 1  # the amax pass and the converting pass read the same spans


def test_every_plan_covers_each_element_once(plans):
    seen = {}
    for (m, k, per_token, kind), plan in plans.items():
        vec = kind != "scalar"
        key = (k, per_token, vec, plan)
        if key in seen:
            continue
        passes, writers = _row_elements(k, bool(per_token), vec, plan)
        for elems in passes:
            assert elems.size == 0 or (elems.min() >= 0 and elems.max() < k), f"M={m} K={k} {kind} {plan}: outside [0, K)"
            counts = np.bincount(elems, minlength=k)
            assert counts.size == k and bool((counts == 1).all()), f"M={m} K={k} token={per_token} {kind} {plan}: coverage"
        if per_token:
            assert writers == 1, f"M={m} K={k} {kind} {plan}: {writers} writers of the row's scale"
        seen[key] = True
    assert len(seen) > 2000


def test_plans_fit_their_kernels(plans):
    for (m, k, per_token, kind), (threads, slots, spans, resident, cluster, span) in plans.items():
        where = f"M={m} K={k} token={per_token} {kind}"
        assert threads % 32 == 0 and threads >= 32, where
        assert cluster in (1, 2, 4, 8), where
        if cluster > 1:
            assert per_token and kind != "scalar", f"{where}: clusters serve per-token vector rows only"
            assert threads <= CLUSTER_MAX_THREADS and slots in (1, 2) and slots <= CLUSTER_MAX_SLOTS, where
            assert spans == cluster and m * cluster <= CLUSTER_CTA_MAX, where
            assert span % VEC == 0 and span <= threads * VEC * slots, where
            assert (cluster - 1) * span < k, f"{where}: an empty cluster CTA"
        else:
            assert threads <= MAX_THREADS and slots <= MAX_NV[kind], where
            assert slots == MAX_NV[kind] if kind == "scalar" else slots in (1, 2, 4, 8, 16), where
            assert span == threads * VEC * slots, where
            if per_token:
                assert spans == 1 and resident == (k <= span), where
            else:
                assert spans == -(-k // span) and spans <= MAX_GRID_Y, where


def test_cluster_rule(plans):
    """Per-token vector rows take a cluster where one CTA a row leaves the GPU idle and would hold more than
    2 slots a thread (K > 4096); small K and M > 512 stay one CTA a row."""
    on = _cluster_enabled()
    expect = {  # (M, K) -> (cluster, threads, slots) of 16-bit rows
        (1, 2048): (1, 256, 1), (16, 2048): (1, 256, 1), (1, 3584): (1, 256, 2), (1, 4096): (1, 256, 2),
        (1, 4104): (4, 160, 1), (1, 5120): (4, 160, 1), (16, 14336): (8, 224, 1),
        (1, 8192): (4, 256, 1), (16, 8192): (4, 256, 1), (1, 18944): (8, 320, 1), (16, 18944): (8, 320, 1),
        (128, 18944): (8, 320, 1), (129, 18944): (4, 608, 1), (256, 8192): (4, 256, 1), (512, 8192): (2, 512, 1),
        (1, 65536): (8, 1024, 1), (1, 131072): (8, 1024, 2), (1024, 18944): (1, 256, 16), (2048, 8192): (1, 256, 4),
    }
    for (m, k), (cluster, threads, slots) in expect.items():
        got = plans[(m, k, 1, "vec16")]
        want = (cluster, threads, slots) if on or cluster == 1 else (1, min(256, got[0]), got[1])
        assert (got[4], got[0], got[1]) == want, f"M={m} K={k}: {got}"
    for (m, k, per_token, kind), plan in plans.items():
        want = _expected_cluster(m, k) if per_token and kind != "scalar" and on else 1
        assert plan[4] == want, f"M={m} K={k} token={per_token} {kind}: {plan}"


def _expected_cluster(m: int, k: int) -> int:
    """The rule in words: none for K <= 4096 (one CTA a row, at most 2 slots a thread); else the fewest CTAs
    (a power of two, at most 8) of at most 256 x 8 elements each, halved while M x cluster > 1024; none where
    that leaves one CTA a row or a CTA's part needs more than 1024 threads x 2 slots."""
    units = -(-k // VEC)
    if units <= CLUSTER_MIN_UNITS:
        return 1
    c = 1
    while c < MAX_CLUSTER and c * 256 < units:
        c *= 2
    while c > 1 and m * c > CLUSTER_CTA_MAX:
        c //= 2
    return c if c > 1 and -(-units // c) <= CLUSTER_MAX_THREADS * CLUSTER_MAX_SLOTS else 1
