"""Quickstart: quantize the bundled SmolLM2-135M to FP8, save it, load it back, and generate.

    python examples/quickstart.py [--scheme fp8-channel] [--output smollm2-fp8]

Swap ``load_model("smollm2")`` for your own ``AutoModelForCausalLM.from_pretrained(...)`` and pass your
own calibration texts (a list of strings) instead of ``None`` (the bundled calibration text).
"""

from __future__ import annotations

import argparse

import torch

import fp8_linear
from fp8_linear.models import load_model

PROMPT = "The Python statement `with` is used to"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheme", default="fp8-channel", choices=list(fp8_linear.PRESETS))
    ap.add_argument("--output", default="smollm2-fp8")
    ap.add_argument("--samples", type=int, default=16, help="calibration samples of 512 tokens")
    ap.add_argument("--max-new-tokens", type=int, default=30)
    args = ap.parse_args()

    model, tok = load_model("smollm2")                        # fp32 on CPU; any HF causal LM works
    fp8_linear.quantize_model(model, None, args.scheme, tokenizer=tok, max_samples=args.samples)
    print(model.model.layers[0].self_attn.q_proj)              # an FP8Linear now
    fp8_linear.save_quantized(model, args.output, tokenizer=tok, overwrite=True)

    served = fp8_linear.load_quantized(args.output, dtype=torch.float32)  # what a server would do
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = served.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
    print(tok.decode(out[0], skip_special_tokens=True))


if __name__ == "__main__":
    main()
