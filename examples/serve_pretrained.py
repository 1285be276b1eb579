"""Serve any FP8 checkpoint we read: load it onto ``FP8Linear`` with ``fp8_linear.load_quantized`` and generate.

    python examples/serve_pretrained.py model-fp8                      # saved by save_quantized / save_pretrained
    python examples/serve_pretrained.py path/to/llm-compressor-FP8_DYNAMIC --max-new-tokens 64
    python examples/serve_pretrained.py deepseek-style-fp8 --tokenizer path/to/original --device-map cuda:0

Formats read (docs/design.md section 6): compressed-tensors FP8 (ours and llm-compressor's: per-tensor,
per-channel and block weights; static and dynamic activations), vLLM / AutoFP8 ``quant_method: "fp8"``
(per-tensor, and ``weight_block_size`` blocks with ``weight_scale_inv``), transformers
``FineGrainedFP8Config`` and ``fbgemm_fp8``, and NVIDIA ModelOpt FP8 exports. Only the stored FP8 tensors
are materialized (peak memory about the checkpoint size). The script prints what it found (format, scheme
and count of the FP8 layers) and the greedy continuation of the prompt. A folder without a tokenizer
takes ``--tokenizer``, or generates from ``--token-ids`` and prints ids.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

import fp8_linear

PROMPT = "The Python statement `with` is used to"
#: Prompt token ids used when there is no tokenizer (any ids inside every vocabulary).
DEFAULT_TOKEN_IDS = "1 2 3 4"


def describe(model) -> str:
    """One line: the checkpoint format and the FP8 layers per scheme."""
    qc = getattr(model.config, "quantization_config", None) or {}
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    schemes = Counter(m.scheme.name for m in model.modules() if isinstance(m, fp8_linear.FP8Linear))
    layers = ", ".join(f"{n} x {s}" for s, n in schemes.items())
    return f"format {method or 'ModelOpt (hf_quant_config.json)'}: {sum(schemes.values())} FP8Linear layers ({layers})"


def load_tokenizer(*folders):
    """The tokenizer of the first folder that has one, else None."""
    from transformers import AutoTokenizer

    for folder in folders:
        if folder is None:
            continue
        try:
            return AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError, TypeError):
            continue
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="an FP8 checkpoint folder (config.json + safetensors)")
    ap.add_argument("--tokenizer", help="where the tokenizer is, when the checkpoint folder has none")
    ap.add_argument("--device-map", default="cuda:0" if torch.cuda.is_available() else "cpu",
                    help='"cpu", "cuda:0", "auto" or an accelerate device map')
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="dtype of the high-precision parts (default: bfloat16 on a GPU, float32 on a CPU)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--token-ids", default=DEFAULT_TOKEN_IDS, help="prompt ids used when there is no tokenizer")
    ap.add_argument("--max-new-tokens", type=int, default=30)
    args = ap.parse_args()

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if args.device_map == "cpu" else torch.bfloat16)
    model = fp8_linear.load_quantized(args.checkpoint, device_map=args.device_map, dtype=dtype)
    print(describe(model))
    tok = load_tokenizer(args.checkpoint, args.tokenizer)
    if tok is not None:
        ids = tok(args.prompt, return_tensors="pt").input_ids
    else:
        ids = torch.tensor([[int(t) for t in args.token_ids.split()]])
    ids = ids.to(model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                             do_sample=False)
    if tok is not None:
        print(tok.decode(out[0], skip_special_tokens=True))
    else:
        print("generated ids:", out[0, ids.shape[1]:].tolist())


if __name__ == "__main__":
    main()
