"""``FP8Linear`` against BF16 ``nn.Linear`` on the GPU, activation quantization included: the module-level
bars (fp8-block at least 1.7x BF16 at M = 4096 and 1.5x at M = 1 on the 70B shapes; every preset at
least 1.0x at M = 1 and 16).

    python -m benchmarks.linear_bench --out benchmarks/results                 # 70B + 8B layers, M 1 / 16 / 4096
    python -m benchmarks.linear_bench --models 70b --ms 1,4096 --presets fp8-block
    python -m benchmarks.linear_bench --models Qwen2.5-7B,Llama-3.2-1B --ms 1,16 # any decode-set model, or Qwen2.5-7B

Timing: M < 2048 in CUDA graphs (each layer's weight is read from HBM: a graph replays calls over
``copies`` layer copies that together span at least ``--rotate-mb``), M >= 2048 steady state
(``benchmarks.common.timing.time_steady``). Each preset's layer is ``FP8Linear.from_linear`` of the
same BF16 layer (dynamic activations for fp8-dynamic / fp8-block; a static scale from the input's amax
for fp8-tensor / fp8-channel). One JSON with every time and the ratios BF16 / FP8 (> 1: FP8 faster).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch

from benchmarks.common import operands as O
from benchmarks.common.shapes import DECODE_MODELS, ModelDims
from benchmarks.common import timing as T
from benchmarks.common.results import environment

#: (model, layer, N, K): the Llama-3.1 70B and 8B linear layers.
LAYERS = (("70b", "qkv", 10240, 8192), ("70b", "o", 8192, 8192), ("70b", "gate_up", 57344, 8192),
          ("70b", "down", 8192, 28672), ("8b", "qkv", 6144, 4096), ("8b", "o", 4096, 4096),
          ("8b", "gate_up", 28672, 4096), ("8b", "down", 4096, 14336))
#: A served model outside the decode set (its qkv, 4608 x 3584, is the shape the decode bar was filed on).
QWEN25_7B = ModelDims("Qwen2.5-7B", 3584, 18944, 28, 4, 128)
PRESETS = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")


def layers_of(models: list[str]) -> list[tuple[str, str, int, int]]:
    """``(model, layer, N, K)`` of each named model: ``70b`` / ``8b`` (:data:`LAYERS`), a model of the
    decode set (``benchmarks.common.shapes.DECODE_MODELS``, fused qkv and gate_up) or ``Qwen2.5-7B``."""
    dims = {d.name: d for d in (*DECODE_MODELS, QWEN25_7B)}
    unknown = [m for m in models if m not in dims and m not in {row[0] for row in LAYERS}]
    if unknown:
        raise SystemExit(f"linear_bench: unknown models {unknown}; expected 70b, 8b or one of {sorted(dims)}")
    out = []
    for model in models:
        if model in dims:
            out += [(model, layer.split(" ", 1)[1], n, k) for layer, n, k in dims[model].linear_nk()]
        else:
            out += [row for row in LAYERS if row[0] == model]
    return out
STEADY_M = 2048


def build_layers(n: int, k: int, presets: list[str], copies: int) -> dict[str, list[torch.nn.Module]]:
    """``copies`` BF16 ``nn.Linear(k, n)`` on the GPU and each preset's ``FP8Linear`` of them."""
    from fp8_linear import FP8Linear

    out: dict[str, list[torch.nn.Module]] = {"bf16": []}
    for p in presets:
        out[p] = []
    for _ in range(copies):
        lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        out["bf16"].append(lin)
        for p in presets:
            static = p in ("fp8-tensor", "fp8-channel")
            out[p].append(FP8Linear.from_linear(lin, p, input_amax=4.0 if static else None))
    return out


def measure(n: int, k: int, m: int, presets: list[str], rotate_mb: int, rounds: int) -> dict:
    """us per call of each candidate at ``m`` tokens, and the backends the FP8 layers run on."""
    copies = 1 if m >= STEADY_M else O.rotation_copies(n * k, rotate_mb * 2 ** 20, max_copies=8)
    layers = build_layers(n, k, presets, copies)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        if m >= STEADY_M:
            fns = {name: (lambda mods=mods: mods[0](x)) for name, mods in layers.items()}
            times = T.time_steady(fns, rounds=rounds, burn_s=0.3, rep=200)
        else:
            calls = {name: [(lambda mod=mod: mod(x)) for mod in mods] for name, mods in layers.items()}
            times = T.time_graph(calls, rounds=rounds)
    row = {"M": m, "N": n, "K": k, "copies": copies,
           "backends": {p: getattr(layers[p][0], "backend", "?") for p in presets}}
    for name, ts in times.items():
        row[name] = ts if isinstance(ts, str) else T.best(ts) * 1e3
    for p in presets:
        if not isinstance(row.get(p), str) and not isinstance(row.get("bf16"), str):
            row[f"bf16/{p}"] = row["bf16"] / row[p]
    del layers
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="70b,8b")
    ap.add_argument("--ms", default="1,16,4096")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--rotate-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="", help="folder for the JSON file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("linear_bench: needs a CUDA GPU")
    models = args.models.split(",")
    presets = [p for p in args.presets.split(",") if p]
    ms = [int(v) for v in args.ms.split(",")]
    rows = []
    print(f"FP8Linear vs BF16 nn.Linear, us per call (activation quantization included); ratio bf16 / preset")
    print(f"{'layer':14s} {'M':>5s} {'bf16':>8s} " + " ".join(f"{p:>12s} {'x':>5s}" for p in presets))
    for model, name, n, k in layers_of(models):
        for m in ms:
            row = measure(n, k, m, presets, args.rotate_mb, args.rounds)
            row["layer"] = f"{model} {name}"
            rows.append(row)
            cells = " ".join(f"{row[p]:12.1f} {row.get(f'bf16/{p}', float('nan')):5.2f}" if not isinstance(row[p], str)
                             else f"{'n/a':>12s} {'':5s}" for p in presets)
            print(f"{row['layer']:14s} {m:5d} {row['bf16']:8.1f} {cells}", flush=True)
    print("geomean bf16 / preset per M:")
    for m in ms:
        parts = []
        for p in presets:
            vals = [r[f"bf16/{p}"] for r in rows if r["M"] == m and f"bf16/{p}" in r]
            if vals:
                parts.append(f"{p} {T.geomean(vals):.3f} (min {min(vals):.3f})")
        print(f"  M={m}: " + "; ".join(parts))
    if args.out:
        path = pathlib.Path(args.out) / f"linear-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"env": environment(), "rows": rows}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
