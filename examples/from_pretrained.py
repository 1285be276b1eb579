"""Quantize while loading: ``from_pretrained(..., quantization_config=FP8LinearConfig(...))``, then generate.

    python examples/from_pretrained.py                          # the bundled SmolLM2 (saved as a bf16 HF folder first)
    python examples/from_pretrained.py --model path/to/hf-folder --scheme fp8-block --output model-fp8

Each Linear's weight is quantized as transformers reads it from the checkpoint, so the high-precision
model never sits in memory (peak: about the FP8 model plus one layer's weight). Only schemes without
calibration load this way (``fp8-dynamic``: per-channel weights and per-token activations; ``fp8-block``:
128x128 weight blocks and 1x128 activation groups); a static scheme needs ``fp8_linear.quantize_model``
and calibration data (``examples/quickstart.py``). ``--output`` saves with ``model.save_pretrained``: the
compressed-tensors checkpoint ``fp8_linear.save_quantized`` writes, which ``fp8_linear.load_quantized``,
vLLM and transformers read; the script loads it back and checks that it generates the same tokens.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

import fp8_linear

PROMPT = "The Python statement `with` is used to"
#: Schemes that need no calibration data.
LOAD_TIME_SCHEMES = ("fp8-dynamic", "fp8-block")


def bundled_bf16_folder(dest: str) -> str:
    """Save the bundled SmolLM2-135M-Instruct as a bf16 Hugging Face folder in ``dest`` (what a download looks like)."""
    from fp8_linear.models import load_model

    model, tok = load_model("smollm2", dtype=torch.bfloat16)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a bf16/fp16/fp32 Hugging Face folder or hub id (default: the bundled SmolLM2)")
    ap.add_argument("--scheme", default="fp8-dynamic", choices=LOAD_TIME_SCHEMES)
    ap.add_argument("--output", help="save the FP8 model here (compressed-tensors) and check that it reloads")
    ap.add_argument("--device-map", default="cuda:0" if torch.cuda.is_available() else "cpu",
                    help='"cpu", "cuda:0", "auto", ... (as for any from_pretrained)')
    ap.add_argument("--max-new-tokens", type=int, default=30)
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # bf16 activations on a GPU; fp32 on a CPU, where it is the fast and exact choice
    dtype = torch.float32 if args.device_map == "cpu" else torch.bfloat16
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or bundled_bf16_folder(os.path.join(tmp, "smollm2-bf16"))
        model = AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=fp8_linear.FP8LinearConfig(scheme=args.scheme), dtype=dtype,
            device_map=args.device_map)
        tok = AutoTokenizer.from_pretrained(folder)
    print(next(m for m in model.modules() if isinstance(m, fp8_linear.FP8Linear)))  # e.g. the first q_proj

    ids = tok(args.prompt, return_tensors="pt").input_ids.to(model.device)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
    print(tok.decode(out[0], skip_special_tokens=True))

    if args.output:
        model.save_pretrained(args.output)  # compressed-tensors, as fp8_linear.save_quantized writes
        tok.save_pretrained(args.output)
        served = fp8_linear.load_quantized(args.output, dtype=dtype, device_map=args.device_map)
        with torch.inference_mode():
            again = served.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
        same = torch.equal(out, again)
        print(f"saved {args.output}; reloaded with load_quantized: {'same' if same else 'DIFFERENT'} tokens")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
