"""Calibration at scale on one GPU: GPTQ calibration of a Llama-3-8B-shaped model, layer by layer.

    python benchmarks/calibrate_gpu.py [--quick] [--out DIR]

Two measurements (random bf16 weights: time and memory do not depend on the values):

1. ``speed``: a Llama-3-8B-shaped model (``--layers`` decoder layers, default all 32) on the CPU,
   calibrated with GPTQ (``fp8-channel``) on ``--samples`` x ``--seq-len`` random tokens (default
   256 x 2048) with ``quantize_model(..., layerwise=True, device="cuda")``: every calibration forward,
   every ``H`` and every GPTQ sweep on the GPU, one decoder layer resident at a time, hidden states
   kept on the GPU. Prints wall time (and, with fewer layers, the time scaled to 32), peak GPU memory.
2. ``cap``: the full 32-layer model, whose bf16 weights (16 GB) exceed a GPU memory cap set with
   ``torch.cuda.set_per_process_memory_fraction`` (``--cap-gib``, default 14), calibrated the same way
   with the hidden states offloaded to the CPU (``--cap-samples`` x 2048 tokens); the run must finish
   within the cap (an allocation above it raises CUDA out-of-memory), and the peak is printed.

After each run, layer 0's ``q_proj`` and ``down_proj`` are checked against their bf16 originals on
random inputs (``calc_diff`` below 1e-3) so that a fast but wrong run cannot pass.

``--quick`` (about 3 minutes on an H200): ``speed`` with 8 layers, ``cap`` with 64 x 2048 tokens.
Writes ``calibrate_gpu.json`` to ``--out`` (default ``$OUT`` or ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the layer-0 check runs FP8Linear on the GPU through the numerical reference (no kernel build needed)
os.environ.setdefault("FP8_LINEAR_BACKEND", "emulated")

from fp8_linear import FP8Linear, quantize_model  # noqa: E402

#: Llama-3-8B's shape (meta-llama/Meta-Llama-3-8B config.json).
LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
                 tie_word_embeddings=False)
FULL_LAYERS = 32
WEIGHT_STD = 0.02


def build_model(layers: int):
    """A Llama-3-8B-shaped ``LlamaForCausalLM`` with ``layers`` decoder layers, random bf16 weights on the CPU
    (made on the meta device and filled in place: no slow fp32 initialisation)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": layers})
    cfg._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.to_empty(device="cpu")
    g = torch.Generator(device="cuda").manual_seed(0)  # drawn on the GPU (fast), one tensor at a time
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, dtype=torch.bfloat16, device="cuda", generator=g).mul_(WEIGHT_STD))
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)  # its buffers were made on meta
    return model.eval()


def weight_gib(model) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def check_layer0(model, originals: dict) -> dict:
    """calc_diff of layer 0's FP8 q_proj / down_proj against the bf16 originals on random inputs (GPU)."""
    out = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    for name, ref in originals.items():
        q = model.get_submodule(name)
        if not isinstance(q, FP8Linear):
            raise RuntimeError(f"{name}: expected an FP8Linear after quantization, got {type(q).__name__}")
        q = q.to("cuda")
        x = torch.randn(64, ref.in_features, device="cuda", dtype=torch.bfloat16, generator=g)
        with torch.inference_mode():
            out[name] = calc_diff(q(x), torch.nn.functional.linear(x, ref.weight.cuda()))
        q.to("cpu")
    return out


def run_one(layers: int, samples: int, seq_len: int, offload: bool, cap_gib: float | None) -> dict:
    t0 = time.perf_counter()
    model = build_model(layers)
    t_build = time.perf_counter() - t0
    names = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj")
    originals = {}
    for n in names:
        lin = model.get_submodule(n)
        originals[n] = torch.nn.Linear(lin.in_features, lin.out_features, bias=False, dtype=torch.bfloat16)
        originals[n].weight.data.copy_(lin.weight.data)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, LLAMA3_8B["vocab_size"], (samples, seq_len), generator=g)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    total = torch.cuda.get_device_properties(0).total_memory
    if cap_gib is not None:
        torch.cuda.set_per_process_memory_fraction(cap_gib * 2**30 / total)
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        quantize_model(model, list(ids), "fp8-channel", gptq=True, seq_len=seq_len, max_samples=samples, batch_size=4,
                       layerwise=True, device="cuda", offload_activations=offload, hessian_tokens=samples * seq_len,
                       progress=True)
        torch.cuda.synchronize()
        t_cal = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated()
    finally:
        if cap_gib is not None:
            torch.cuda.set_per_process_memory_fraction(1.0)
    diffs = check_layer0(model, originals)
    res = {"layers": layers, "samples": samples, "seq_len": seq_len, "tokens": samples * seq_len,
           "weights_bf16_gib": round(weight_gib_of_shape(layers), 2), "offload_activations": offload,
           "cap_gib": cap_gib, "build_s": round(t_build, 1), "calibrate_s": round(t_cal, 1),
           "peak_gpu_gib": round(peak / 2**30, 2), "layer0_calc_diff": diffs}
    if layers != FULL_LAYERS:
        res["calibrate_s_scaled_to_32_layers"] = round(t_cal * FULL_LAYERS / layers, 1)
    for n, d in diffs.items():
        if not d < 1e-3:
            raise RuntimeError(f"{n}: calc_diff {d:.2e} against the bf16 original, expected < 1e-3")
    if cap_gib is not None and peak > cap_gib * 2**30:
        raise RuntimeError(f"peak GPU memory {peak / 2**30:.2f} GiB above the cap {cap_gib} GiB")
    del model
    return res


def weight_gib_of_shape(layers: int) -> float:
    """bf16 bytes of a Llama-3-8B-shaped model with ``layers`` layers (embeddings + head + layers), in GiB."""
    h, i, v, kv = LLAMA3_8B["hidden_size"], LLAMA3_8B["intermediate_size"], LLAMA3_8B["vocab_size"], 8 * 128
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h
    return (2 * v * h + h + layers * per_layer) * 2 / 2**30


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8-layer speed run, 64-sample cap run (about 3 minutes)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers of the speed run (default 32; --quick 8)")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--cap-gib", type=float, default=14.0, help="GPU memory cap of the cap run (GiB)")
    ap.add_argument("--cap-samples", type=int, default=None, help="samples of the cap run (default 256; --quick 64)")
    ap.add_argument("--skip", choices=("speed", "cap"), default=None)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("calibrate_gpu: needs a CUDA GPU", file=sys.stderr)
        return 2
    layers = args.layers or (8 if args.quick else FULL_LAYERS)
    cap_samples = args.cap_samples or (64 if args.quick else args.samples)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "command": "python benchmarks/calibrate_gpu.py" + (" --quick" if args.quick else "")}
    print(json.dumps(info), flush=True)
    results = {}
    if args.skip != "speed":
        results["speed"] = run_one(layers, args.samples, args.seq_len, offload=False, cap_gib=None)
        print("speed:", json.dumps(results["speed"]), flush=True)
    if args.skip != "cap":
        if weight_gib_of_shape(FULL_LAYERS) <= args.cap_gib:
            raise SystemExit(f"--cap-gib {args.cap_gib}: must be below the model's bf16 weights "
                             f"({weight_gib_of_shape(FULL_LAYERS):.1f} GiB)")
        results["cap"] = run_one(FULL_LAYERS, cap_samples, args.seq_len, offload=True, cap_gib=args.cap_gib)
        print("cap:", json.dumps(results["cap"]), flush=True)
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    path = pathlib.Path(args.out) / "calibrate_gpu.json"
    path.write_text(json.dumps({**info, **results}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
