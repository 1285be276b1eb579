"""``compare_schemes``: calibrate once, quantize with every scheme, optionally save and reload each
checkpoint, evaluate all against the unquantized model on held-out data, and tabulate.

The baseline row is the unquantized model in the dtype it is evaluated in (``float32`` by default:
on a CPU fp32 is the fast and exact choice; pass a bf16 model to get a bf16 baseline). Every quantized
model runs its FP8 GEMM with activations and outputs in that same dtype, so the differences in the
table are due to FP8 alone.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from fp8_linear.scheme import PRESETS, QuantScheme, resolve_scheme

from .data import DEFAULT_BATCH_SIZE, DEFAULT_MAX_SAMPLES, DEFAULT_SEQ_LEN, Batch, corpus_text, materialize_batches
from .evaluate import (
    DEFAULT_EVAL_BATCH_SIZE,
    DEFAULT_EVAL_SEQ_LEN,
    DEFAULT_EVAL_WINDOWS,
    eval_batches,
    evaluate_models,
    is_causal_lm,
    paired_delta_se,
)
from .experts import apply_experts_quantization, calibrate_experts, experts_quantized_in_place, select_experts
from .quantize import (
    DEFAULT_IGNORE,
    _set_module,
    apply_quantization,
    calibrate,
    needs_histogram,
    prepare_weights,
    select_linears,
)
from .report import ComparisonTable

#: Encoders: sentences of the eval split used for embedding cosine, and their max length.
ENCODER_EVAL_SAMPLES = 64
ENCODER_EVAL_SEQ_LEN = 128


def preset_gap(table: ComparisonTable, a: str, b: str) -> tuple[float, float]:
    """``(gap, se)``: how far preset ``a``'s perplexity is above preset ``b``'s, in points of the
    "ppl vs base %" column, and the paired standard error of that gap (both evaluated on the same
    windows by one :func:`compare_schemes` call; causal LMs only). Raises ``KeyError`` naming a
    preset the table does not hold."""
    nll = table.notes.get("window_nll", {})
    for name in (a, b):
        if name not in nll:
            raise KeyError(f"preset {name!r}: not in the table's per-window NLLs (have {sorted(nll)})")
    base = table.rows[0]["scheme"]
    d = [x - y for x, y in zip(nll[a], nll[b])]
    if len(d) < 2:
        raise ValueError(f"preset_gap: needs at least 2 eval windows, got {len(d)}")
    mean = sum(d) / len(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
    nb = sum(nll[base]) / len(nll[base])
    ra, rb = math.exp(sum(nll[a]) / len(d) - nb), math.exp(sum(nll[b]) / len(d) - nb)
    return 100.0 * (ra - rb), 100.0 * ra * se


def _baseline_name(model: nn.Module) -> str:
    dt = next(model.parameters()).dtype
    return "unquantized-" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dt, str(dt))


def _encoder_sentences(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n") if len(p.split()) >= 4]


def build_eval_batches(model: nn.Module, eval_data, tokenizer, *, seq_len: int = DEFAULT_EVAL_SEQ_LEN,
                       max_windows: int = DEFAULT_EVAL_WINDOWS, batch_size: int = DEFAULT_EVAL_BATCH_SIZE) -> list[Batch]:
    """Evaluation batches for ``model``.

    Causal LMs: fixed ``seq_len`` windows of the text (``eval_data`` a string or list of strings,
    joined; ``None`` = the embedded eval split), or the user's token batches as given.
    Encoders: one sentence per sample (lines of the eval split with >= 4 words when ``None``).
    """
    causal = is_causal_lm(model)
    if eval_data is None or isinstance(eval_data, str) or (
            isinstance(eval_data, (list, tuple)) and eval_data and all(isinstance(s, str) for s in eval_data)):
        text = corpus_text("eval") if eval_data is None else (
            eval_data if isinstance(eval_data, str) else "\n\n".join(eval_data))
        if causal:
            return eval_batches(tokenizer, text, seq_len=seq_len, max_windows=max_windows, batch_size=batch_size)
        sents = _encoder_sentences(text) if eval_data is None or isinstance(eval_data, str) else list(eval_data)
        return materialize_batches(sents, tokenizer, name="eval_data", seq_len=ENCODER_EVAL_SEQ_LEN,
                                   max_samples=ENCODER_EVAL_SAMPLES, batch_size=16)
    return materialize_batches(eval_data, tokenizer, name="eval_data", seq_len=seq_len, max_samples=max_windows * batch_size,
                               batch_size=batch_size)


@contextlib.contextmanager
def _quantized_in_place(model, targets, scheme, observers, gptq, cache, act_order=None):
    """``model`` with ``targets`` swapped for FP8Linear inside the block, its own modules after it.
    Yields a one-element list holding the seconds the swap took."""
    t0 = time.perf_counter()
    try:
        apply_quantization(model, dict(targets), scheme, observers, gptq=gptq, cache=cache, act_order=act_order)
        yield [time.perf_counter() - t0]
    finally:
        for name, lin in targets.items():
            _set_module(model, name, lin)


def _folder_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 2**20


def compare_schemes(
    model: nn.Module,
    eval_data=None,
    schemes: Sequence["str | QuantScheme"] = tuple(PRESETS),
    calib_data=None,
    *,
    tokenizer=None,
    ignore: Iterable[str] = DEFAULT_IGNORE,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = DEFAULT_BATCH_SIZE,
    eval_windows: int = DEFAULT_EVAL_WINDOWS,
    eval_seq_len: int = DEFAULT_EVAL_SEQ_LEN,
    gptq: bool = True,
    save_reload: bool = True,
    checkpoint_dir: str | os.PathLike | None = None,
    output_dir: str | os.PathLike | None = None,
    progress: bool = True,
    calib_dtype: torch.dtype | None = None,
    hessian_tokens: int | None = None,
    act_order: bool | None = None,
) -> ComparisonTable:
    """Quantize ``model`` with each scheme and compare them against the unquantized model.

    Args:
        model: an unquantized transformers causal LM or encoder (left unchanged; copies are quantized).
        eval_data: held-out data (text, list of strings, token batches in any accepted form);
            ``None`` = the embedded corpus' eval split (disjoint from its calibration split).
        schemes: preset names or :class:`~fp8_linear.QuantScheme` s (default: every preset).
        calib_data: calibration data in any accepted form (``None`` = the embedded calibration split);
            calibrated once, shared by every static scheme.
        tokenizer: needed for text data.
        ignore / max_samples / seq_len / batch_size: as for ``quantize_model``.
        eval_windows / eval_seq_len: causal LMs: number and length of the perplexity windows.
        gptq: GPTQ error compensation of the weight rounding (see ``quantize_model``), for every scheme.
        save_reload: save each quantized model with ``save_quantized`` and evaluate the reloaded
            checkpoint (``load_quantized``), i.e. exactly what a user would serve.
        checkpoint_dir: where the checkpoints go (``<dir>/<scheme>``); default a temporary folder
            that is removed at the end.
        output_dir: if given, the table (``comparison.md/.csv/.json``) and PNG plots are written there.
        progress: tqdm progress bars.
        calib_dtype: dtype of the calibration forwards (``None`` = the model's; ``torch.bfloat16`` is
            ~3x faster on a CPU with AMX); evaluation always runs in the model's dtype.
        hessian_tokens / act_order: GPTQ's ``H`` token cap and column order, as for ``quantize_model``
            (``None``: every calibration token, act-order on; ``4096`` / ``False``: the earlier defaults).

    Returns:
        a :class:`~fp8_linear.calibration.report.ComparisonTable`: baseline row first, one row per scheme.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    for arg, value in (("eval_windows", eval_windows), ("eval_seq_len", eval_seq_len)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{arg}: expected a positive int, got {value!r}")
    schemes = [resolve_scheme(s) for s in schemes]
    if not schemes:
        raise ValueError("schemes: expected at least one scheme or preset name, got none")
    names = [s.name for s in schemes]
    if len(set(names)) != len(names):
        raise ValueError(f"schemes: expected distinct scheme names, got {names}")
    dtype = next(model.parameters()).dtype
    targets = select_linears(model, ignore)
    notes = {"eval_data": "bundled eval split (pydoc_data)" if eval_data is None else None,
             "eval_dtype": str(dtype).replace("torch.", ""), "calib_dtype": str(calib_dtype or dtype).replace("torch.", ""),
             "gptq": gptq, "schemes": {s.name: s.__dict__ for s in schemes}}
    if gptq:
        from . import gptq as gptq_mod  # the defaults as they are when called

        notes.update(gptq_act_order=gptq_mod.ACT_ORDER if act_order is None else bool(act_order),
                     gptq_hessian_tokens=gptq_mod.MAX_TOKENS if hessian_tokens is None else hessian_tokens)
    observers, t_cal = None, 0.0
    experts, experts_obs = select_experts(model, ignore), {}  # fused MoE experts (docs/moe.md)
    if gptq or any(s.static for s in schemes):
        t0 = time.perf_counter()
        batches = materialize_batches(calib_data, tokenizer, seq_len=seq_len, max_samples=max_samples, batch_size=batch_size, model=model)
        observers = calibrate(model, targets, batches, progress=progress, histogram=needs_histogram(schemes), hessian=gptq,
                              dtype=calib_dtype, hessian_tokens=hessian_tokens)
        experts_obs = calibrate_experts(model, experts, batches, progress=progress) if experts else {}
        t_cal = time.perf_counter() - t0
        notes.update(calib_samples=sum(b.input_ids.shape[0] for b in batches), calib_tokens=sum(b.num_tokens for b in batches),
                     calibrate_s=round(t_cal, 2))
    eb = build_eval_batches(model, eval_data, tokenizer, seq_len=eval_seq_len, max_windows=eval_windows)
    own_tmp = checkpoint_dir is None and save_reload
    ckpt_root = tempfile.mkdtemp(prefix="fp8-compare-") if own_tmp else (str(checkpoint_dir) if checkpoint_dir else None)
    quantized, extra, weight_cache = {}, {}, {}
    t0 = time.perf_counter()
    with torch.no_grad():  # every preset's weight scales and GPTQ rounding, in one pass
        prepare_weights(targets, schemes, observers, gptq, weight_cache,
                        progress=f"GPTQ {', '.join(names)}" if progress and gptq else None, act_order=act_order)
    t_weights = time.perf_counter() - t0
    notes["weights_s"] = round(t_weights, 2)
    try:
        for s in schemes:
            t0 = time.perf_counter()
            if save_reload:
                from fp8_linear.checkpoint import load_quantized, save_quantized

                # quantize the model itself (no copy: the reloaded checkpoint is what gets evaluated),
                # save, and put its own Linear modules back
                path = os.path.join(ckpt_root, s.name)
                with _quantized_in_place(model, targets, s, observers, gptq, weight_cache, act_order) as t_apply, \
                        experts_quantized_in_place(model, experts, s, experts_obs):
                    save_quantized(model, path, tokenizer=tokenizer, overwrite=True)
                q = load_quantized(path, dtype=dtype).eval()
                extra[s.name] = {"quantize_s": t_apply[0], "checkpoint_mb": _folder_mb(path)}
            else:
                q = copy.deepcopy(model)
                apply_quantization(q, select_linears(q, ignore), s, observers, gptq=gptq, cache=weight_cache, act_order=act_order)
                apply_experts_quantization(q, select_experts(q, ignore), s, experts_obs)
                extra[s.name] = {"quantize_s": time.perf_counter() - t0}
            # calibration and the weight pass are shared: each preset is charged all of both
            extra[s.name]["quantize_s"] += t_weights + (t_cal if observers else 0.0)
            quantized[s.name] = q
        # evaluation needs neither the calibration statistics nor the rounded fp32 weights: free them
        # first (about 3 GB for SmolLM2-135M: the Hessians and three GPTQ weight recipes)
        observers = None
        weight_cache.clear()
        base = _baseline_name(model)
        results = evaluate_models({base: model, **quantized}, base, eb, progress=progress)
    finally:
        if own_tmp:
            shutil.rmtree(ckpt_root, ignore_errors=True)
    table = ComparisonTable(notes=notes)
    base_ppl = results[base].perplexity
    for name, r in results.items():
        row = {"scheme": name, "perplexity": r.perplexity, "top1_agreement": r.top1_agreement, "kl": r.kl,
               "embedding_cosine": r.embedding_cosine, "mean_sqnr_db": r.mean_sqnr_db, "min_sqnr_db": r.min_sqnr_db,
               **extra.get(name, {})}
        if base_ppl is not None:
            row["ppl_delta_pct"] = 100.0 * (r.perplexity / base_ppl - 1.0)
            se = paired_delta_se(r, results[base]) if name != base else None
            if se is not None:
                row["ppl_delta_se_pct"] = 100.0 * (r.perplexity / base_ppl) * se
        table.rows.append(row)
        if r.layer_sqnr_db:
            table.layer_sqnr_db[name] = r.layer_sqnr_db
    notes["eval_tokens_or_samples"] = results[base].tokens
    if base_ppl is not None:  # per-window NLL of every row: paired differences between any two presets
        notes["window_nll"] = {name: r.window_nll for name, r in results.items()}
    if output_dir is not None:
        notes["files"] = table.save(output_dir)
    return table
