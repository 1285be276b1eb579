"""Tensor-parallel FP8Linear against one device: 2 ``gloo`` processes on the CPU (emulated backend).

Every preset's tensor-parallel logits must match the single-device logits of the same FP8 model. The
FP8 bytes and scales are identical on both sides (sharded after quantization, dynamic per-token scales
reduced over the ranks), so the only difference is the order of the FP32 sums of the row-parallel
layers; through bf16 activations that can flip an occasional e4m3 rounding in a later layer. The bar
is docs/design.md section 7's quantized-model bar (calc_diff below 1e-3) tightened tenfold; the argmax
must agree wherever the reference's top-2 gap is decided (above a few bf16 ulps) and on at least 98% of
the 256 positions overall (random weights make near-ties common).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tp_worker import PRESETS

CALC_DIFF_BAR = 1e-4
TOP1_BAR = 0.98
WORKER = Path(__file__).with_name("tp_worker.py")


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    env = dict(os.environ, FP8_LINEAR_TP_CPU="1", FP8_LINEAR_BACKEND="emulated", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(WORKER), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("preset", PRESETS)
def test_tensor_parallel_matches_one_device(tp_results, preset):
    for rank, res in enumerate(tp_results):
        r = res[preset]
        assert r["finite"], f"rank {rank}: non-finite logits"
        assert r["calc_diff"] < CALC_DIFF_BAR, f"rank {rank}: calc_diff {r['calc_diff']:.3g}"
        assert r["top1_agree"] >= TOP1_BAR, f"rank {rank}: top-1 agreement {r['top1_agree']:.3f}"
        assert r["top1_agree_decided"] == 1.0, f"rank {rank}: decided top-1 agreement {r['top1_agree_decided']:.3f}"
        assert r["q_rows_local"] * r["world"] == 256, "q_proj was not split over the ranks"
