"""Host cost of one call of a compiled decode step, apart from running it: dynamo's guards and argument passing.

A small Llama (width 128, ``--layers`` decoder layers, random weights, bf16) with its decoder Linears as
BF16 ``nn.Linear`` or ``FP8Linear`` of each preset is compiled (``fullgraph=True``) the way
transformers compiles its static-cache decode step, with a backend that runs the graph once and then
returns that result: what a call costs afterwards is the guard evaluation and the collection of the
graph's inputs, the part of a compiled call that grows with the number of layers and tensors. Each
path runs in its own process (no other compiled entry to fail through first); the figure is the best of
``--rounds`` rounds of 10 calls. Runs on a CPU. A path ``<preset>+fused`` also fuses the q/k/v and
gate/up siblings (``fp8_linear.fuse_projections``).

    python -m benchmarks.compiled_call_overhead [--layers 8] [--paths bf16,fp8-tensor,fp8-channel,fp8-dynamic]
    python -m benchmarks.compiled_call_overhead --paths bf16,fp8-tensor,fp8-tensor+fused
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

PATHS = ("bf16", "fp8-tensor", "fp8-channel", "fp8-dynamic")
#: Path suffix: the FP8 siblings fused (q/k/v, gate/up).
FUSED = "+fused"
#: The small Llama: only the structure matters (layers, modules, tensors), not the width.
CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


def measure(path: str, layers: int, rounds: int) -> dict:
    """``{path, layers, us_per_call, graph_inputs}`` of one path, in this process."""
    import torch
    from torch import nn
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    from fp8_linear import FP8Linear, fuse_projections

    preset, fused = (path[: -len(FUSED)], True) if path.endswith(FUSED) else (path, False)
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=layers, **CONFIG)
    model = LlamaForCausalLM(cfg).eval().to(torch.bfloat16)
    if preset != "bf16":
        for name, lin in list(model.named_modules()):
            if isinstance(lin, nn.Linear) and name != "lm_head":
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, FP8Linear.from_linear(lin, preset, input_amax=1.0))
    if fused:
        fuse_projections(model)
    inputs = {}

    def run_once(gm, example_inputs):
        inputs["n"] = len(example_inputs)
        out = gm(*example_inputs)
        return lambda *args: out

    step = torch.compile(model.forward, backend=run_once, fullgraph=True)
    pos = torch.tensor([3])
    kw = dict(input_ids=torch.zeros(1, 1, dtype=torch.long), past_key_values=StaticCache(config=cfg, max_cache_len=64),
              cache_position=pos, position_ids=pos[None], use_cache=True)
    best = float("inf")
    with torch.inference_mode():
        step(**kw)
        step(**kw)
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(10):
                step(**kw)
            best = min(best, (time.perf_counter() - t0) / 10)
    return dict(path=path, layers=layers, us_per_call=round(best * 1e6, 1), graph_inputs=inputs["n"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process of one path
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.layers, args.rounds)))
        return 0
    rows = []
    for path in args.paths.split(","):
        out = subprocess.run([sys.executable, "-m", "benchmarks.compiled_call_overhead", "--one", path,
                              "--layers", str(args.layers), "--rounds", str(args.rounds)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["us_per_call"]
    linears = 7 * args.layers
    print(f"compiled decode step, {args.layers} layers ({linears} linear layers): host us per call beyond running it")
    for r in rows:
        print(f"{r['path']:<18} {r['us_per_call']:>8.1f} us  ({(r['us_per_call'] - base) / linears:+.2f} us per linear "
              f"layer against {rows[0]['path']}; {r['graph_inputs']} graph inputs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
