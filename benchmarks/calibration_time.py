"""Time calibrating + quantizing SmolLM2-135M (32 samples x 512 tokens of the bundled text) on this machine.

    python benchmarks/calibration_time.py [--schemes fp8-channel ...] [--samples 32] [--seq-len 512] [--no-gptq]
                                          [--calib-dtype bfloat16] [--threads N]
                                          [--out benchmarks/results/calibration_time_<date>.txt]

For each preset, ``quantize_model`` runs on a fresh copy of the model, exactly as a user calls it
(calibration forwards, activation statistics, GPTQ rounding, module swap); model loading is
excluded and timed separately. Prints one line per preset and the stage split of the calibration
(``calibrate``: the forwards with hooks; ``weights``: scales + GPTQ), the torch thread count, and the
machine's load average (other processes on a shared CPU slow every step). With ``--out`` the same
lines are also written to that file.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository root, for ``benchmarks.common``
    sys.path.insert(0, str(ROOT))

import fp8_linear  # noqa: E402
from benchmarks.common.log import Log  # noqa: E402
from fp8_linear.calibration import quantize as qmod  # noqa: E402
from fp8_linear.cli import pick_threads  # noqa: E402
from fp8_linear.models import load_model  # noqa: E402

#: The issue's bar for 32 x 512 tokens on a 2-core CPU.
BAR_S = 60.0
PRESETS = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")


class _StageTimer:
    """Wall time spent in ``calibrate`` and ``prepare_weights`` of ``fp8_linear.calibration.quantize``."""

    def __init__(self):
        self.t = {"calibrate": 0.0, "prepare_weights": 0.0}
        self._orig = {k: getattr(qmod, k) for k in self.t}
        for k, f in self._orig.items():
            setattr(qmod, k, self._wrap(k, f))

    def _wrap(self, key, f):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                self.t[key] += time.perf_counter() - t0

        return timed

    def reset(self):
        self.t = dict.fromkeys(self.t, 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", nargs="+", default=list(PRESETS), choices=PRESETS)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--no-gptq", action="store_true")
    ap.add_argument("--calib-dtype", choices=("float32", "bfloat16"), default="float32",
                    help="dtype of the calibration forwards (the model and evaluation stay fp32)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: the free cores, as fp8-linear)")
    ap.add_argument("--out", default=None, help="also write the printed lines to this file")
    args = ap.parse_args()
    say = Log()

    torch.set_num_threads(pick_threads(args.threads))
    t0 = time.perf_counter()
    model, tok = load_model("smollm2")
    say(f"# {datetime.datetime.now().isoformat(timespec='seconds')}  torch {torch.__version__}, threads "
        f"{torch.get_num_threads()}, cpus {os.cpu_count()}; model load {time.perf_counter() - t0:.1f} s (excluded)")
    say(f"# command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    timer = _StageTimer()
    for scheme in args.schemes:
        q = copy.deepcopy(model)
        timer.reset()
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        fp8_linear.quantize_model(q, None, scheme, tokenizer=tok, max_samples=args.samples, seq_len=args.seq_len,
                                  progress=False, gptq=False if args.no_gptq else None,
                                  calib_dtype=getattr(torch, args.calib_dtype))
        dt = time.perf_counter() - t0
        n = sum(isinstance(m, fp8_linear.FP8Linear) for m in q.modules())
        say(f"calibrate+quantize SmolLM2-135M, {scheme}, gptq={not args.no_gptq}, {args.samples} x {args.seq_len} tokens, "
            f"calibration forwards in {args.calib_dtype}, "
            f"{n} layers: {dt:.1f} s (calibrate {timer.t['calibrate']:.1f} s, weights {timer.t['prepare_weights']:.1f} s; "
            f"bar {BAR_S:.0f} s: {'PASS' if dt < BAR_S else 'FAIL'}); load average at start {load:.2f}")
        del q
    if args.out:
        say.write(args.out)


if __name__ == "__main__":
    main()
