"""Per-tensor against per-channel FP8 on your own eval file: one table, written as a report.

    python examples/compare_schemes.py --eval my_eval.txt                        # the bundled SmolLM2
    python examples/compare_schemes.py --model path/to/hf-folder --eval my_eval.txt --calib my_calib.txt -o report/
    python examples/compare_schemes.py --eval my_eval.txt --schemes fp8-tensor fp8-channel fp8-dynamic fp8-block

The model is calibrated once on ``--calib`` (default: the bundled calibration text, disjoint from any eval
text you bring), quantized with each scheme (``fp8-tensor``: one weight scale per tensor, ``fp8-channel``:
one per output channel; both with a calibrated static activation scale), saved and reloaded exactly as a
server would load it, and evaluated against the unquantized model on perplexity windows of ``--eval``.
``-o`` gets ``comparison.md`` / ``.csv`` / ``.json`` and the plots. Text files are split into samples at
blank lines.
"""

from __future__ import annotations

import argparse
import pathlib

import fp8_linear
from fp8_linear.models import load_model

#: The comparison this example is about; any presets may be named with --schemes.
DEFAULT_SCHEMES = ("fp8-tensor", "fp8-channel")


def read_samples(path: str) -> list[str]:
    """The paragraphs (blank-line separated) of a UTF-8 text file; ``ValueError`` if it has none."""
    text = pathlib.Path(path).read_text(encoding="utf-8")
    samples = [p.strip() for p in text.split("\n\n") if p.strip()]
    if not samples:
        raise ValueError(f"{path}: expected text (paragraphs separated by blank lines), got an empty file")
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", required=True, help="your eval text file")
    ap.add_argument("--calib", help="calibration text file (default: the bundled calibration text)")
    ap.add_argument("--model", default="smollm2", help="an HF folder, a .gguf file or a bundled name (default smollm2)")
    ap.add_argument("--schemes", nargs="+", default=list(DEFAULT_SCHEMES), choices=list(fp8_linear.PRESETS))
    ap.add_argument("-o", "--output", default="fp8-compare-report", help="folder for the report")
    ap.add_argument("--samples", type=int, default=32, help="calibration samples")
    ap.add_argument("--windows", type=int, default=16, help="eval windows")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per calibration sample and eval window")
    ap.add_argument("--no-gptq", action="store_true", help="round weights to nearest (faster) instead of GPTQ")
    args = ap.parse_args()

    model, tok = load_model(args.model)                        # fp32 on CPU: fast and exact there
    table = fp8_linear.compare_schemes(
        model, read_samples(args.eval), schemes=args.schemes,
        calib_data=read_samples(args.calib) if args.calib else None, tokenizer=tok,
        max_samples=args.samples, seq_len=args.seq_len, eval_windows=args.windows, eval_seq_len=args.seq_len,
        gptq=not args.no_gptq, output_dir=args.output,
    )
    print(table)
    print(f"report: {pathlib.Path(args.output).resolve()}/comparison.md (+ .csv, .json, plots)")


if __name__ == "__main__":
    main()
