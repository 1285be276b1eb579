"""Decode chains in CUDA graphs, programmatic dependent launch on and off: the seven linear layers of
Llama-3-8B decoder layers (q, k, v, o, gate, up, down) as one stream of FP8Linear calls, each call the
extension's activation quantization -> GEMM (split K summed inside it), against the same chain of BF16
nn.Linear. What PDL (fp8_linear/kernels/include/pdl.h, docs/kernel-log.md v28) saves shows per kernel boundary.

    python -m benchmarks.chain_bench                                   # M 1 and 16, 8 layers, two presets
    python -m benchmarks.chain_bench --ms 1 --presets fp8-dynamic --out "$OUT"

Each candidate's graph holds `--layers` decoder layers (their own weights: 218 MB of FP8 each, so the
weights come from HBM), captured with its PDL setting: `pdl` (on, the GEMM's L2 prefetch of its first
weight k-blocks at the default depth), `pdl-nopf` (on, no prefetch), `off`. Candidates alternate over
`--rounds` (A/B/B/A); the best round is printed as us per decoder layer. Inputs: q, k, v read the layer
input, o reads q's output, gate and up read o's, down reads gate's and feeds the next layer (no torch
kernels in between: every boundary is between two of our kernels).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import timing as T
from benchmarks.common.results import environment, write_json

#: (name, N, K) of a Llama-3-8B decoder layer's linear layers (hidden 4096, 8 KV heads of 128, MLP 14336).
LLAMA3_8B = (("q", 4096, 4096), ("k", 1024, 4096), ("v", 1024, 4096), ("o", 4096, 4096),
             ("gate", 14336, 4096), ("up", 14336, 4096), ("down", 4096, 14336))
HIDDEN = 4096
PRESETS = ("fp8-dynamic", "fp8-channel")
STATIC_PRESETS = ("fp8-tensor", "fp8-channel")
#: (candidate suffix, PDL on, L2 prefetch depth: None = the process default, 0 = none)
PDL_VARIANTS = (("pdl", True, None), ("pdl-nopf", True, 0), ("off", False, None))


def build(presets: list[str], layers: int) -> dict[str, list[dict[str, torch.nn.Module]]]:
    """`layers` decoder layers of BF16 nn.Linear and each preset's FP8Linear of them."""
    from fp8_linear import FP8Linear

    mods: dict[str, list[dict[str, torch.nn.Module]]] = {"bf16": [], **{p: [] for p in presets}}
    for _ in range(layers):
        bf = {name: torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16) for name, n, k in LLAMA3_8B}
        mods["bf16"].append(bf)
        for p in presets:
            amax = 4.0 if p in STATIC_PRESETS else None
            mods[p].append({name: FP8Linear.from_linear(lin, p, input_amax=amax) for name, lin in bf.items()})
    return mods


def chain(stack: list[dict[str, torch.nn.Module]], x: torch.Tensor) -> torch.Tensor:
    """The decoder layers' linear calls in order (see the module doc for which output feeds which)."""
    for layer in stack:
        q = layer["q"](x)
        layer["k"](x)
        layer["v"](x)
        o = layer["o"](q)
        g = layer["gate"](o)
        layer["up"](o)
        x = layer["down"](g)
    return x


def kernels_per_layer(preset: str, m: int) -> int:
    """Our kernel launches per decoder layer: quantization + GEMM per linear, + a reduction where split."""
    from fp8_linear.backends import sm90
    from fp8_linear.backends.base import MODE_STATIC, MODE_TOKEN

    mode = MODE_STATIC if preset in STATIC_PRESETS else MODE_TOKEN
    return sum(2 + (sm90._choice(m, n, k, mode, torch.bfloat16)[1] > 1) for _, n, k in LLAMA3_8B)


def measure(mods, presets: list[str], m: int, layers: int, rounds: int) -> dict:
    """us per decoder layer of every candidate at M = m (best of `rounds`), and the saving per boundary."""
    from fp8_linear.kernels import jit

    ext = jit.load()
    x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
    graphs: dict[str, torch.cuda.CUDAGraph] = {"bf16": T.capture([lambda: chain(mods["bf16"], x)])}
    old = ext.pdl_state()
    try:
        for p in presets:
            for suffix, on, prefetch in PDL_VARIANTS:
                ext.set_pdl(on, prefetch)
                graphs[f"{p} {suffix}"] = T.capture([lambda p=p: chain(mods[p], x)])
                ext.set_pdl(*old)
    finally:
        ext.set_pdl(*old)
    ms = {name: [] for name in graphs}
    names = list(graphs)
    for rnd in range(rounds):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            ms[name].append(T.replay_ms(graphs[name], layers))
    row = {"M": m, "layers": layers, "backends": {p: getattr(mods[p][0]["q"], "backend", "?") for p in presets}}
    for name, ts in ms.items():
        row[name] = min(ts) * 1e3
    for p in presets:
        kernels = kernels_per_layer(p, m)
        row[f"{p} kernels"] = kernels
        row[f"{p} saving per boundary"] = (row[f"{p} off"] - row[f"{p} pdl"]) / kernels
        row[f"{p} prefetch gain"] = row[f"{p} pdl-nopf"] - row[f"{p} pdl"]
        row[f"bf16/{p} pdl"] = row["bf16"] / row[f"{p} pdl"]
        row[f"bf16/{p} off"] = row["bf16"] / row[f"{p} off"]
    del graphs
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--layers", type=int, default=8, help="decoder layers per graph")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="", help="folder for the JSON file (default benchmarks/results)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("chain_bench: needs a CUDA GPU")
    presets = [p for p in args.presets.split(",") if p]
    ms = [int(v) for v in args.ms.split(",")]
    rows = []
    with torch.no_grad():
        mods = build(presets, args.layers)
    with torch.inference_mode():
        print(f"Llama-3-8B decoder layer (7 linear calls), us per layer in a CUDA graph of {args.layers} layers")
        for m in ms:
            row = measure(mods, presets, m, args.layers, args.rounds)
            rows.append(row)
            print(f"M={m:<4d} bf16 {row['bf16']:8.1f}  backends {row['backends']}")
            for p in presets:
                cells = "  ".join(f"{s} {row[f'{p} {s}']:8.1f}" for s, _, _ in PDL_VARIANTS)
                print(f"  {p:12s} {cells}  | kernels {row[f'{p} kernels']:2d}, saving per boundary "
                      f"{row[f'{p} saving per boundary']:5.2f} us, prefetch gain {row[f'{p} prefetch gain']:5.1f} us, "
                      f"bf16/fp8 {row[f'bf16/{p} pdl']:.3f} (off {row[f'bf16/{p} off']:.3f})", flush=True)
    path = write_json("chain", environment({"presets": presets, "layers": args.layers}), {}, rows, args.out or None)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
