"""GPTQ's own objective per weight recipe on SmolLM2, from the calibration data only (no eval text).

For every Linear layer with enough calibration tokens, ``tr(dW H dW^T) / tr(W H W^T)``: the relative
output error power of the GPTQ-rounded weight on the calibration inputs (``H = sum x x^T``), summed
over layers; for fp8-tensor scales and for fp8-channel scales multiplied by a headroom factor (room
for GPTQ's updates above each row's amax, which otherwise saturate), and for the per-channel scales as
the library makes them with GPTQ: aligned to the grid by input energy (``fp8_linear/calibration/scale_align.py``).
Also counts weights that end at ``+-fmt_max * scale``. Weights only: activations stay unquantized here.

Usage: python benchmarks/gptq_objective.py [--samples 16] [--headroom 1,1.0625,1.125,1.25]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fp8_linear.calibration.data import materialize_batches  # noqa: E402
from fp8_linear.calibration.gptq import gptq_fp8_many  # noqa: E402
from fp8_linear.calibration.observers import weight_scale  # noqa: E402
from fp8_linear.calibration.scale_align import align_weight_scale  # noqa: E402
from fp8_linear.calibration.quantize import GPTQ_MIN_TOKENS_PER_FEATURE, calibrate, select_linears  # noqa: E402
from fp8_linear.formats import fmt_max  # noqa: E402
from fp8_linear.models import load_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=16, help="calibration windows of 512 tokens (main job: 16)")
    ap.add_argument("--headroom", default="1,1.0625,1.125,1.25", help="fp8-channel scale multipliers")
    args = ap.parse_args()
    t0 = time.time()
    model, tok = load_model(None)
    targets = select_linears(model)
    batches = materialize_batches(None, tok, seq_len=512, max_samples=args.samples, batch_size=4)
    obs = calibrate(model, targets, batches, progress=False, histogram=False, hessian=True)
    recipes = ([("fp8-tensor", "tensor", 1.0)] + [(f"fp8-channel x{h}", "channel", float(h)) for h in args.headroom.split(",")]
               + [("fp8-channel aligned", "channel", "align")])
    err = {r[0]: 0.0 for r in recipes}
    sat = {r[0]: 0 for r in recipes}
    groups: dict[int, list[str]] = {}
    for name in targets:
        groups.setdefault(id(obs[name].hessian), []).append(name)
    m = fmt_max(torch.float8_e4m3fn)
    for names in groups.values():
        hess = obs[names[0]].hessian
        if hess.tokens < GPTQ_MIN_TOKENS_PER_FEATURE * hess.h.shape[0]:
            continue  # the library rounds these to nearest
        h = hess.h.double()
        ws = [targets[n].weight.detach().float() for n in names]
        h_diag = torch.diagonal(hess.h)
        scales = [align_weight_scale(w, weight_scale(w, gran, "e4m3", "minmax"), h_diag, gran) if mult == "align"
                  else weight_scale(w, gran, "e4m3", "minmax") * mult for _, gran, mult in recipes for w in ws]
        res = gptq_fp8_many([w for _ in recipes for w in ws], hess, scales, "e4m3")
        for i, (label, _, _) in enumerate(recipes):
            for j, w in enumerate(ws):
                q, wd = res[i * len(ws) + j].double(), w.double()
                d = q - wd
                err[label] += (torch.einsum("ij,jk,ik->", d, h, d) / torch.einsum("ij,jk,ik->", wd, h, wd)).item()
                s = scales[i * len(ws) + j].double().expand_as(q)
                sat[label] += int((q.abs() >= 0.999 * m * s).sum())
    print(f"SmolLM2-135M, {sum(b.num_tokens for b in batches)} calibration tokens, GPTQ layers only ({time.time() - t0:.0f} s)")
    print(f"{'recipe':<22} {'sum of relative GPTQ error':>27} {'weights at +-fmt_max':>21}")
    for label, _, _ in recipes:
        print(f"{label:<22} {err[label]:27.5f} {sat[label]:21d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
