"""``fp8-linear eval MODEL [--reference REF]``: perplexity (causal LMs) or embedding fidelity (encoders)
on held-out data; with a reference also top-1 agreement, KL and per-layer SQNR."""

from __future__ import annotations

import json
from pathlib import Path

from .checks import check_model, check_output_file, require_positive
from .common import EXIT_OK, CLIError, result, show_progress
from .data import DATA_HELP, read_data
from .loading import load, require_same_outputs
from .options import DEFAULT_EVAL_WINDOWS, DEFAULT_SEQ_LEN, MODEL_HELP, WINDOWS_HELP, add_run_options
from .threads import set_threads

MODEL_FLAG, REF_FLAG = "MODEL", "--reference"
FLAGS = {"eval_data": "--data", "seq_len": "--seq-len", "max_windows": "--windows", "model": MODEL_FLAG}
#: Metrics printed per model, in this order (those that apply).
METRICS = ("perplexity", "top1_agreement", "kl", "embedding_cosine", "mean_sqnr_db")
#: Metrics that only mean something against a reference.
PAIRED = ("top1_agreement", "kl", "embedding_cosine")


def max_positions(model) -> int | None:
    """The longest input the model's position embeddings cover (``config.max_position_embeddings``)."""
    v = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return v if isinstance(v, int) and v > 0 else None


def fit_length(model, requested: int | None, flag: str) -> int:
    """Tokens per sample: ``requested`` if it fits the model's positions (else a :class:`CLIError` naming
    ``flag``); ``None`` (not given) -> :data:`DEFAULT_SEQ_LEN`, or the model's positions if fewer."""
    limit = max_positions(model)
    if requested is None:
        return DEFAULT_SEQ_LEN if limit is None else min(DEFAULT_SEQ_LEN, limit)
    if limit is not None and requested > limit:
        raise CLIError(f"{flag}: {requested} tokens per sample exceed the model's {limit} positions")
    return requested


def eval_batches_checked(model, data, tok, seq_len: int | None, windows: int, data_flag: str, len_flag: str):
    """Evaluation batches of ``data`` for ``model`` (``build_eval_batches``), checked: the windows fit the
    model's positions (:func:`fit_length`), a causal LM gets at least one next token to predict. Errors
    name the flags. Returns ``(batches, seq_len)``."""
    from fp8_linear.calibration.compare import build_eval_batches
    from fp8_linear.calibration.evaluate import is_causal_lm

    seq_len = fit_length(model, seq_len, len_flag) if is_causal_lm(model) else seq_len or DEFAULT_SEQ_LEN
    if tok is None and (data is None or isinstance(data, list) and data and isinstance(data[0], str)):
        raise CLIError(f"{data_flag}: text data needs a tokenizer and the model has none; "
                       "give token ids instead (a .jsonl file with an 'input_ids' field per line)")
    try:
        batches = build_eval_batches(model, data, tok, seq_len=seq_len, max_windows=windows)
    except ValueError as e:
        raise CLIError(f"{data_flag}: {e}") from None
    if is_causal_lm(model):
        predicted = sum(b.attention_mask[:, 1:].sum().item() for b in batches)
        if predicted == 0:
            tokens = sum(b.num_tokens for b in batches)
            raise CLIError(f"{data_flag}: the data holds {tokens} token(s) per window; perplexity needs at least 2 "
                           "(a token and the one that follows it)")
    return batches, seq_len


def run(args) -> int:
    from fp8_linear.calibration.evaluate import evaluate_models, is_causal_lm

    require_positive(args, "windows", "seq_len")
    check_model(args.model, MODEL_FLAG)
    if args.reference is not None:
        check_model(args.reference, REF_FLAG)
    data = read_data(args.data, "--data")
    if args.json:
        check_output_file(args.json, "--json")
    set_threads(args.threads)
    model, tok = load(args.model, args.dtype, MODEL_FLAG)
    if not args.reference and not is_causal_lm(model):
        raise CLIError(f"{REF_FLAG}: {args.model!r} is an encoder ({type(model).__name__}): its metric, the embedding "
                       "cosine, compares it with a reference; give the unquantized model as --reference")
    models = {"model": model}
    if args.reference:
        ref, ref_tok = load(args.reference, args.dtype, REF_FLAG)
        require_same_outputs(model, ref, MODEL_FLAG, REF_FLAG)
        models = {"reference": ref, "model": model}
        tok = tok or ref_tok  # a checkpoint saved without its tokenizer: the reference's
    batches, _ = eval_batches_checked(model, data, tok, args.seq_len, args.windows, "--data", "--seq-len")
    res = evaluate_models(models, next(iter(models)), batches, progress=show_progress())
    out = {}
    for name, r in res.items():
        vals = {k: getattr(r, k) for k in METRICS}
        out[name] = {k: v for k, v in vals.items() if v is not None and not (len(res) == 1 and k in PAIRED)}
        result(f"{name:10s} " + "  ".join(f"{k}={v:.5g}" for k, v in out[name].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="perplexity / embedding fidelity of a model, optionally against a reference",
                       description="Evaluate a model (e.g. a saved FP8 checkpoint) on held-out text; with --reference "
                                   "also top-1 agreement, KL divergence, per-layer SQNR (or embedding cosine for encoders).")
    p.add_argument("model", metavar=MODEL_FLAG, nargs="?", default=None, help=f"{MODEL_HELP}")
    p.add_argument("--reference", default=None, metavar="REF",
                   help="the unquantized model to compare against (same forms as MODEL; default: none)")
    p.add_argument("--data", metavar="DATA", default=None, help=f"evaluation data (default: the bundled eval split): {DATA_HELP}")
    p.add_argument("--windows", type=int, default=DEFAULT_EVAL_WINDOWS, metavar="N", help=WINDOWS_HELP)
    p.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help=f"causal LMs: tokens per window (default {DEFAULT_SEQ_LEN}, or the model's positions if fewer)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the metrics as JSON to FILE")
    add_run_options(p)
    p.set_defaults(func=run, flags=FLAGS)
