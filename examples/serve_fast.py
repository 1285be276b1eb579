"""Serve an FP8 checkpoint fast: load it, generate with the compiled static cache, print tokens/s.

    python examples/serve_fast.py smollm2-fp8                 # a folder saved by save_quantized (or llm-compressor, ...)
    python examples/serve_fast.py smollm2-fp8 --batch 16 --new-tokens 256
    python examples/serve_fast.py                             # no folder: quantizes the bundled SmolLM2 first
    python examples/serve_fast.py smollm2-fp8 --no-fuse       # q/k/v and gate/up as separate GEMMs
    python examples/serve_fast.py smollm2-fp8 --skip-guards   # time with dynamo's per-step guards skipped

``generate(..., cache_implementation="static")`` makes transformers compile the decode step with
``torch.compile`` (CUDA graphs, ``mode="reduce-overhead"``); ``FP8Linear`` traces with no graph break,
so each step is one graph replay. Before compiling, ``fp8_linear.fuse_projections`` runs each decoder
layer's q/k/v and gate/up projections as one GEMM each (4 FP8 GEMMs a layer instead of 7; ``--no-fuse``
keeps them apart). The first call compiles (tens of seconds), later calls are fast: the
script times a second call. On a CPU, pass ``--compile-on-cpu`` to compile there too (slow to compile).
See docs/serving.md.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import torch

import fp8_linear

PROMPT = "Write a short note on why the sky is blue."


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", help="an FP8 checkpoint folder (default: quantize the bundled SmolLM2)")
    ap.add_argument("--scheme", default="fp8-dynamic", choices=list(fp8_linear.PRESETS),
                    help="preset used when no checkpoint is given")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile-on-cpu", action="store_true", help="compile the decode step on a CPU as well")
    ap.add_argument("--no-fuse", action="store_true", help="keep q/k/v and gate/up as separate FP8 GEMMs")
    ap.add_argument("--skip-guards", action="store_true",
                    help="after the compiling call, time under torch.compiler.set_stance(skip_guard_eval_unsafe=True)"
                         " (dynamo stops re-checking the model's Python state each step; safe while nothing in"
                         " the model, the batch size or the cache length changes)")
    args = ap.parse_args()
    from transformers import AutoTokenizer
    from transformers.generation.configuration_utils import CompileConfig

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    folder = args.checkpoint
    if folder is None:
        from fp8_linear.models import load_model

        model, tok = load_model("smollm2")
        fp8_linear.quantize_model(model, None, args.scheme, tokenizer=tok, max_samples=8)
        folder = tempfile.mkdtemp(prefix="serve-fast-")
        fp8_linear.save_quantized(model, folder, tokenizer=tok, overwrite=True)
        print(f"quantized the bundled SmolLM2 ({args.scheme}) into {folder}")

    model = fp8_linear.load_quantized(folder, dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    layers = [m for m in model.modules() if isinstance(m, fp8_linear.FP8Linear)]
    print(f"{len(layers)} FP8Linear layers on {device}, backend {sorted({m.backend for m in layers})}")
    if not args.no_fuse:
        print(fp8_linear.fuse_projections(model))  # after the move to the device, before compiling
    ids = tok([PROMPT] * args.batch, return_tensors="pt").input_ids.to(device)
    compile_config = CompileConfig(fullgraph=True)
    if device.type != "cuda" and args.compile_on_cpu:
        compile_config._compile_all_devices = True  # transformers compiles on accelerators only by default
    kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
              cache_implementation="static", compile_config=compile_config, pad_token_id=tok.eos_token_id)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(ids, **kw)  # compiles and captures the decode step
        _sync(device)
        first = time.perf_counter() - t0
        stance = torch.compiler.set_stance(skip_guard_eval_unsafe=True) if args.skip_guards else contextlib.nullcontext()
        with stance:
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            _sync(device)
            took = time.perf_counter() - t0
    new = out.shape[1] - ids.shape[1]
    print(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    print(f"first call (compiles) {first:.1f} s; then {args.batch} x {new} tokens in {took:.2f} s: "
          f"{args.batch * new / took:.1f} tokens/s (prompt {ids.shape[1]} tokens, prefill included"
          f"{'; guards skipped' if args.skip_guards else ''})")


if __name__ == "__main__":
    main()
