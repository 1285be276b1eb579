"""The traced activation quantization inside its producer's inductor kernel: what each form costs a call.

Under ``torch.compile`` an FP8 layer's activation quantization is torch ops (``fp8_linear/graph_quant.py``)
that inductor fuses into the kernel producing the activation: the RMSNorm before q/k/v and gate/up, the
SiLU-and-multiply before down, a copy of the attention output before o. This times those kernels at decode
sizes, one compiled function per (site, form, M, K), captured in a CUDA graph and replayed:

- ``none``: the producer alone, bf16 out (what BF16 runs);
- ``static-div`` / ``token-div``: static per-tensor / dynamic per-token scales, the quotient ``x / scale``
  taken in fp64 per element (``graph_quant.exact_div``: the traced form before 2026-12-04);
- ``static-rcp`` / ``token-rcp``: ``graph_quant``'s forms, ``RN32(RN64(x) * RN64(1 / scale))``, the fp64
  reciprocal of the scale and one fp64 multiply per element: the same fp32 quotient (the proof is in
  ``fp8_linear/kernels/csrc/act_quant.cu``, ``scaled``), what the CUDA kernel computes;
- ``static-pre``: as ``static-rcp`` with the fp64 reciprocal computed outside the compiled function (a
  tensor input), in case inductor recomputes a broadcast scalar's reciprocal per element.

Each quantizing form's FP8 bytes and scales are compared bit for bit with the eager CUDA kernel
(``fp8_linear.ops``) applied to the compiled producer's bf16 output (the ``none`` form's). Needs a CUDA GPU.

Usage: python -m benchmarks.traced_quant_bench [--ms 1,16,64] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.common.results import environment, write_json
from benchmarks.common.timing import median, time_graph
from fp8_linear import graph_quant, ops
from fp8_linear.formats import MIN_SCALE, SCALE_DTYPE, fmt_max

FP8 = torch.float8_e4m3fn
#: The 8B shape's quantization sites: (site, K of the layer it feeds).
SITES = (("norm", 4096), ("plain", 4096), ("silu", 14336))
FORMS = ("none", "static-div", "static-rcp", "static-pre", "token-div", "token-rcp")


def quant(y: torch.Tensor, form: str, scale: torch.Tensor, rcp: torch.Tensor):
    """``y`` quantized in ``form`` (``(q, scale)``; ``none`` returns ``(y, scale)``); ``rcp`` is
    ``RN64(1 / scale)`` (fp64), read by ``static-pre`` only."""
    m = fmt_max(FP8)
    if form == "static-pre":
        return (y.to(torch.float64) * rcp).to(SCALE_DTYPE).clamp(-m, m).to(FP8), scale
    if form == "none":
        return y, scale
    if form == "static-rcp":
        return graph_quant.quantize_static(y, scale, FP8), scale
    if form == "token-rcp":
        return graph_quant.quantize_per_token(y, FP8)
    if form == "token-div":
        a = y.to(SCALE_DTYPE).abs()
        amax = torch.where(a < float("inf"), a, 0.0).amax(dim=-1, keepdim=True)
        scale = graph_quant.exact_div(amax, torch.full_like(amax, m)).clamp(min=MIN_SCALE)
    return graph_quant.exact_div(y, scale).clamp(-m, m).to(FP8), scale


def producer(site: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The activation as the model computes it: Llama's RMSNorm, SiLU(gate) * up, or the tensor itself."""
    if site == "norm":
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        return w * h.to(x.dtype)
    if site == "silu":
        g, u = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(g) * u
    return x


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8 else t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("traced_quant_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    print(f"{'site':6} {'M':>4} {'K':>6} | " + " ".join(f"{f:>11}" for f in FORMS) + " | bitwise")
    for site, k in SITES:
        for m in [int(v) for v in args.ms.split(",")]:
            width = 2 * k if site == "silu" else k
            x = (torch.randn(m, width, device=dev, generator=gen) * 3).to(torch.bfloat16)
            w = (torch.rand(k, device=dev, generator=gen) + 0.5).to(torch.bfloat16)
            s = torch.tensor([0.05], device=dev)
            r = 1.0 / s.to(torch.float64)
            outs, calls = {}, {}
            torch._dynamo.reset()  # the lambdas below share one code object: a compile per form, under the limit
            for form in FORMS:
                fn = torch.compile(lambda x, w, s, r, form=form: quant(producer(site, x, w), form, s, r),
                                   fullgraph=True)
                outs[form] = fn(x, w, s, r)
                calls[form] = [lambda fn=fn: fn(x, w, s, r)]
            times = time_graph(calls, rounds=3)
            ref_y = outs["none"][0]  # the compiled producer's bf16 output: eager RMSNorm rounds differently
            eager = {"static": (ops.quantize_static(ref_y, s, FP8), s),
                     "token": ops.quantize_dynamic(ref_y, FP8, "token")}
            same = {}
            for form in FORMS[1:]:
                q, sc = outs[form]
                eq, esc = eager[form.split("-")[0]]
                same[form] = bool(torch.equal(bits(q), bits(eq)) and torch.equal(sc.reshape(-1), esc.reshape(-1)))
            us = {f: median(times[f]) * 1e3 for f in FORMS}
            rows.append(dict(site=site, m=m, k=k, us=us, bitwise_eager=same))
            print(f"{site:6} {m:>4} {k:>6} | " + " ".join(f"{us[f]:>11.2f}" for f in FORMS)
                  + " | " + " ".join(f"{f}={'ok' if v else 'DIFF'}" for f, v in same.items()), flush=True)
    meta = environment()
    path = write_json("traced-quant", meta, {}, rows, out=args.out)
    print(f"wrote {path}")
    return 0 if all(all(r["bitwise_eager"].values()) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
