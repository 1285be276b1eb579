"""Time calibrating + quantizing SmolLM2-135M (32 samples x 512 tokens of the bundled text) on this machine.

    python benchmarks/calibration_time.py [--scheme fp8-channel] [--samples 32] [--seq-len 512] [--no-gptq]

Prints the wall time of ``quantize_model`` (model loading excluded), the torch thread count, and the
machine's load average when it started (other processes on a shared CPU slow every step).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import fp8_linear
from fp8_linear.models import load_model

#: The issue's bar for 32 x 512 tokens on a 2-core CPU.
BAR_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheme", default="fp8-channel")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--no-gptq", action="store_true")
    args = ap.parse_args()
    model, tok = load_model("smollm2")
    load = os.getloadavg()
    t0 = time.perf_counter()
    fp8_linear.quantize_model(model, None, args.scheme, tokenizer=tok, max_samples=args.samples, seq_len=args.seq_len,
                              progress=False, gptq=False if args.no_gptq else None)
    dt = time.perf_counter() - t0
    n = sum(isinstance(m, fp8_linear.FP8Linear) for m in model.modules())
    print(f"calibrate+quantize SmolLM2-135M, {args.scheme}, gptq={not args.no_gptq}, {args.samples} x {args.seq_len} tokens, "
          f"{n} layers: {dt:.1f} s (bar {BAR_S:.0f} s: {'PASS' if dt < BAR_S else 'FAIL'}); "
          f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, load average at start {load[0]:.2f}")


if __name__ == "__main__":
    main()
