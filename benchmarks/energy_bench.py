"""Energy per FLOP and clock of each GEMM candidate in steady state (NVML, no extra packages).

The H200 runs these GEMMs at its power cap (docs/kernel-log.md v10): the kernel that spends less
energy per FLOP gets the higher clock. This script separates the two factors of a candidate's speed:

    TFLOPS = SM clock x (FLOP per SM clock)          (how busy the tensor cores are per cycle)
    TFLOPS = power / (energy per FLOP)                (at the cap, power is fixed)

Each candidate runs back to back (no cache clearing, no gaps) for ``--burn`` seconds, then for
``--window`` seconds while a thread samples the SM clock and power every 5 ms. Candidates alternate A/B/B/A over ``--rounds``.

Columns: TFLOPS, mean SM MHz, mean W, pJ per FLOP (mean W / FLOP rate; NVML's energy counter,
used at first, lagged the window and disagreed by a few %), and "util" = FLOP per clock over the dense FP8
peak per clock (8192 FLOP / clk / SM x SM count).

``--data`` picks the operands' values (the energy of the tensor-core arithmetic depends on them, so the
power-capped clock does too): ``randn`` (default: N(0, 1) cast to e4m3, what every benchmark here uses),
``scaled`` (N(0, 1) scaled so that the largest magnitude is e4m3's 448, as a per-tensor quantizer
produces), ``ones`` (every value 1.0) and ``zeros``. Several kinds (comma-separated) run one after the other.

``--block`` adds ``auto_blk`` (our kernel with 1x128 activation groups x 128x128 weight blocks, its own
config choice) and ``cublas_blk`` (cuBLASLt's block-scaled ``scaled_mm``): is the block path's time
against per-tensor a lower clock (the promotion's FFMAs spend energy under the cap) or fewer FLOP per
clock (issue)?

``--per-channel`` adds ``auto_ch``: the auto config with per-channel weight scales (is per-channel's
extra time at long K a lower clock, i.e. more energy per FLOP, or fewer FLOP per clock?).

Usage: python -m benchmarks.energy_bench [--shapes 8192x8192x8192,...] [--configs 7,10,11] [--per-channel]
       [--block] [--data randn,scaled,ones,zeros] [--burn 0.6] [--window 1.0] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import statistics
import threading
import time

import torch

from benchmarks.common.operands import DATA_KINDS, cublas_block_call, make_operand
from benchmarks.common.ours import ours_block_call
from benchmarks.common.shapes import parse_shapes

#: Dense FP8 tensor-core FLOP per SM per clock on Hopper (4096 FMA).
FP8_FLOP_PER_CLK_PER_SM = 8192
NVML_CLOCK_SM = 1
#: Side of the block scales (1x128 activation groups, 128x128 weight blocks).
BLOCK = 128
DEFAULT_SHAPES = "8192x8192x8192,8192x6144x4096,2048x6144x4096,6144x6144x1280"


class Nvml:
    """The NVML calls used here, through ctypes (libnvidia-ml ships with the driver)."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.h = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")

    def sm_mhz(self) -> int:
        v = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.h, NVML_CLOCK_SM, ctypes.byref(v))
        return v.value

    def power_limit_w(self) -> float:
        """The enforced power limit (the cap the clock is held under)."""
        v = ctypes.c_uint()
        self.lib.nvmlDeviceGetEnforcedPowerLimit(self.h, ctypes.byref(v))
        return v.value / 1000.0

    def power_w(self) -> float:
        v = ctypes.c_uint()
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(v))
        return v.value / 1000.0


def measure(fn, nv: Nvml, burn: float, window: float, batch: int = 10) -> dict:
    """Run ``fn`` back to back: ``burn`` s unmeasured, then ``window`` s measured."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < burn:
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
    clocks, powers, stop = [], [], threading.Event()

    def sample():
        while not stop.is_set():
            clocks.append(nv.sm_mhz())
            powers.append(nv.power_w())
            time.sleep(0.005)

    th = threading.Thread(target=sample, daemon=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    th.start()
    start.record()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < window:
        for _ in range(batch):
            fn()
        n += batch
    end.record()
    torch.cuda.synchronize()
    stop.set()
    th.join()
    ms = start.elapsed_time(end)
    return {"calls": n, "ms_per_call": ms / n, "gpu_ms": ms,
            "mhz": statistics.mean(clocks), "watts": statistics.mean(powers)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated MxNxK")
    ap.add_argument("--configs", default="7,10,11", help="forced sm90 config ids (besides auto and cuBLASLt)")
    ap.add_argument("--per-channel", action="store_true", help="also the auto config with per-channel scale_b")
    ap.add_argument("--block", action="store_true", help="also ours and cuBLASLt with 1x128 x 128x128 block scales")
    ap.add_argument("--data", default="randn", help=f"comma-separated operand value kinds: {', '.join(DATA_KINDS)}")
    ap.add_argument("--burn", type=float, default=0.6)
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    nv = Nvml()
    import fp8_linear.kernels as kern

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bf = torch.bfloat16
    rows = []
    print(f"enforced power limit: {nv.power_limit_w():.0f} W", flush=True)
    kinds = [d.strip() for d in args.data.split(",") if d.strip()]
    for d in kinds:
        if d not in DATA_KINDS:
            raise SystemExit(f"energy_bench: unknown --data kind {d!r}; expected one of {DATA_KINDS}")
    print(f"{'shape':>20} {'data':>6} {'candidate':>9} | {'TFLOPS':>7} {'MHz':>6} {'W':>5} {'pJ/FLOP':>8} {'util':>6}", flush=True)
    for (m, n, k), data in ((shape.mnk, d) for shape in parse_shapes(args.shapes) for d in kinds):
        spec = f"{m}x{n}x{k}"
        a = make_operand(m, k, data)
        b = make_operand(n, k, data)
        s1, s2 = torch.tensor([0.7], device="cuda"), torch.tensor([1.3], device="cuda")
        fns = {"cublas": lambda: torch._scaled_mm(a, b.t(), scale_a=s1.reshape(()), scale_b=s2.reshape(()), out_dtype=bf),
               "auto": lambda: kern.sm90_gemm(a, b, s1, s2, None, bf)}
        for c in (int(x) for x in args.configs.split(",") if x.strip()):
            fns[f"cfg{c}"] = lambda c=c: kern.sm90_gemm(a, b, s1, s2, None, bf, c)
        if args.per_channel:
            s2c = torch.rand(n, 1, device="cuda") + 0.5
            fns["auto_ch"] = lambda: kern.sm90_gemm(a, b, s1, s2c, None, bf)
        if args.block:
            kb = -(-k // BLOCK)
            sa_g = torch.rand(m, kb, device="cuda") + 0.5
            sb_b = torch.rand(-(-n // BLOCK), kb, device="cuda") + 0.5
            fn, why = ours_block_call(a, b, sa_g, sb_b, bf)
            if fn is None:
                raise SystemExit(f"energy_bench --block: {why}")
            fns["auto_blk"] = fn
            fns["cublas_blk"] = cublas_block_call(a, b, sa_g, sb_b, bf)
        res = {key: [] for key in fns}
        order = list(fns)
        for rnd in range(args.rounds):
            for key in (order if rnd % 2 == 0 else order[::-1]):
                res[key].append(measure(fns[key], nv, args.burn, args.window))
        flop = 2.0 * m * n * k
        for key, rs in res.items():
            best = min(rs, key=lambda r: r["ms_per_call"])
            tflops = flop / (best["ms_per_call"] * 1e-3) / 1e12
            pj = best["watts"] / tflops
            util = tflops * 1e12 / (best["mhz"] * 1e6 * sms * FP8_FLOP_PER_CLK_PER_SM)
            rows.append({"M": m, "N": n, "K": k, "data": data, "candidate": key, "tflops": tflops, "pj_per_flop": pj,
                         "util": util, **best, "rounds": rs})
            print(f"{spec:>20} {data:>6} {key:>9} | {tflops:7.0f} {best['mhz']:6.0f} {best['watts']:5.0f} {pj:8.4f} {util:6.3f}",
                  flush=True)
        del a, b
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
