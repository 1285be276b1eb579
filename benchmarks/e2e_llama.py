"""End-to-end and per-module timing on a Llama-3-shaped model (random weights, GPU).

Builds a Llama-3-8B-shaped decoder (hidden 4096, intermediate 14336, 32 q / 8 kv heads; the layer
count is reduced with --layers to keep the run short; per-layer cost is what matters), quantizes
every Linear with each preset via ``FP8Linear.from_linear`` (static scales from a short random
calibration pass are not needed for timing: input_amax is set from one forward pass), and times a
prefill forward (batch x seq tokens) and single-token decode steps with CUDA events.

    python benchmarks/e2e_llama.py --layers 4 --seq 2048 --json benchmarks/results/e2e-<date>.json

Prints one table: preset x {prefill ms, decode ms, tokens/s}, with BF16 as the baseline row and
the GEMM backend each preset ran on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics

import torch
from torch import nn

import fp8_linear
from fp8_linear.backends import candidates
from fp8_linear.gemm import make_problem

DEVICE = "cuda"


def _time(fn, reps: int) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` runs after 3 warm-ups, with CUDA events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def build_model(layers: int, **shape):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        num_hidden_layers=layers, vocab_size=32000, max_position_embeddings=8192,
    )
    for k, v in shape.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model


def quantize_random(model, preset: str):
    """Replace each decoder Linear with FP8Linear.from_linear (static amax from a forward pass)."""
    scheme = fp8_linear.resolve_scheme(preset)
    amax = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and "lm_head" not in name:
            hooks.append(mod.register_forward_hook(
                lambda m, i, o, n=name: amax.__setitem__(n, max(amax.get(n, 0.0), i[0].abs().amax().item()))))
    with torch.inference_mode():
        model(torch.randint(0, 32000, (1, 256), device=DEVICE))
    for h in hooks:
        h.remove()
    for name in list(amax):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, fp8_linear.FP8Linear.from_linear(getattr(parent, child), scheme, input_amax=amax[name]))
    return model


def backend_of(model) -> str:
    for mod in model.modules():
        if isinstance(mod, fp8_linear.FP8Linear):
            x = torch.zeros(16, mod.in_features, dtype=mod.weight.dtype, device=DEVICE)
            sa = torch.ones(1, device=DEVICE) if mod.input_scale is not None else torch.ones(16, 1, device=DEVICE)
            if mod.scheme.activation_granularity == "group":
                sa = torch.ones(16, (mod.in_features + 127) // 128, device=DEVICE)
            p = make_problem(x, mod.weight, sa, mod.weight_scale, mod.bias, torch.bfloat16)
            return next(n for n, ok, _ in candidates(p) if ok)
    return "bf16"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--presets", default="fp8-tensor,fp8-channel,fp8-dynamic,fp8-block")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("e2e_llama.py needs a CUDA GPU")
    ids = torch.randint(0, 32000, (args.batch, args.seq), device=DEVICE)
    tok = torch.randint(0, 32000, (args.batch, 1), device=DEVICE)
    rows = []
    for preset in ["bf16"] + args.presets.split(","):
        model = build_model(args.layers)
        if preset != "bf16":
            model = quantize_random(model, preset)
        with torch.inference_mode():
            pre = _time(lambda: model(ids), args.reps)
            dec = _time(lambda: model(tok), args.reps * 3)
        rows.append(dict(preset=preset, backend=backend_of(model), prefill_ms=pre, decode_ms=dec,
                         prefill_tok_s=args.batch * args.seq / pre * 1e3))
        del model
        torch.cuda.empty_cache()
    base = rows[0]
    print(f"Llama-3-8B-shaped, {args.layers} layers, batch {args.batch} x {args.seq} tokens, {torch.cuda.get_device_name()}")
    print(f"{'preset':<12} {'backend':<9} {'prefill ms':>10} {'vs bf16':>8} {'decode ms':>10} {'vs bf16':>8} {'prefill tok/s':>14}")
    for r in rows:
        print(f"{r['preset']:<12} {r['backend']:<9} {r['prefill_ms']:>10.2f} {base['prefill_ms'] / r['prefill_ms']:>7.2f}x "
              f"{r['decode_ms']:>10.3f} {base['decode_ms'] / r['decode_ms']:>7.2f}x {r['prefill_tok_s']:>14.0f}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), gpu=torch.cuda.get_device_name(),
                    torch=torch.__version__, cuda=torch.version.cuda, args=vars(args))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
