"""End-to-end serving benchmark: Llama-3-8B- and Qwen2.5-7B-shaped models, BF16 against each FP8 path.

Models are built from a config with random weights (full depth by default: 32 / 28 decoder layers;
``--layers`` cuts them, and the table says so). Each decoder ``nn.Linear`` becomes
``FP8Linear.from_linear`` (static presets calibrated by one forward pass on random tokens); the
embeddings, norms and ``lm_head`` stay BF16, except with ``--fp8-lm-head`` (``lm_head`` an ``FP8Linear`` of
the row's preset) and ``--fp8-embedding`` (the input embedding an ``FP8Embedding``), as
``quantize_model(quantize_lm_head=True, quantize_embeddings=True)`` makes them. Paths: ``bf16``; every preset on the default backend
(``ours``: the sm90 kernel where it runs the layer) and on cuBLASLt (``FP8_LINEAR_BACKEND=cublaslt``);
torchao float8 (``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``: dynamic per-row
activations and weights, what a transformers user picks with ``TorchAoConfig``) when ``torchao``
imports (install the wheel first: ``pip install --no-deps .whl/torchao-*.whl``), else a note.
With ``--fuse`` each FP8 path also runs (or, without ``--no-fuse``, only runs) with its q/k/v and
gate/up projections fused into one GEMM each (``fp8_linear.fuse_projections``; rows ``<preset>
<backend> fused``; the linear-layer split then times the fused GEMMs a forward launches).

Per path and model:

- prefill tokens/s: one forward of ``[1, --prefill]`` tokens with ``logits_to_keep=1`` as ``generate``
  runs it (CUDA events, median of ``--reps``), split as the compiled decode step is (below) into the
  decoder's linear layers at M = ``--prefill`` and the rest (attention, norms, rotary, host launches of the
  eager forward), with the speed-up the BF16 rest allows (``prefill_ceiling``: BF16's forward over BF16's
  rest plus the path's linear layers);
- decode at each ``--batches`` size: greedy ``generate`` of ``--new-tokens`` tokens after a
  ``--prompt``-token prompt, eager (dynamic cache) and compiled static cache (``cache_implementation=
  "static"``: transformers compiles the decode step, CUDA graphs; eager only at ``--eager-batches``). A
  streamer stamps every token (benchmarks/common/generate_clock.py): TTFT is the first token's time, the decode step the median interval
  between tokens (garbage collection off), tokens/s = batch / step; the first decode step of each
  compiled call (it re-records the CUDA graph for the call's new static cache) is reported apart;
- the compiled decode step split two ways: the decoder's linear layers (GEMM + activation
  quantization: the same layers called in order at M = batch, replayed from one CUDA graph) and the
  rest (the step minus them: attention, norms, rotary, embeddings, ``lm_head``, ``generate``'s sampling
  and stopping checks, the host time of the compiled call); ``benchmarks/step_profile.py`` splits the
  rest by GPU kernel;
- weight memory (all parameters, and the decoder linears alone) and peak GPU memory (of the path's
  model: the BF16 linear layers kept aside while an FP8 path runs are left out);
- the first 32 greedy tokens of each compiled run against eager's, per sequence of the batch, and
  where they diverge, by how much the logits of the two runs differ there (random weights give
  near-flat logits, so tokens flip at near-ties; BF16's own row says how often the model itself does).

Writes a table and ``benchmarks/results/e2e-<UTC stamp>[-quick].json``, rewritten (atomically: staged,
then renamed over it) after every measured cell, so a run stopped by a time limit keeps everything it
measured before the cell it was in.

    python -m benchmarks.e2e                      # full depth, both models, every path
    python -m benchmarks.e2e --quick              # ~4 minutes on an H200: 2 layers of the 8B shape
    python -m benchmarks.e2e --models llama3-8b --presets fp8-dynamic --cublaslt fp8-dynamic --budget-s 500
    python -m benchmarks.e2e --models llama3-8b --presets fp8-tensor --cublaslt "" --fuse --no-fuse  # both rows
    python -m benchmarks.e2e --models llama3-8b --presets fp8-tensor,fp8-channel --cublaslt "" --fuse --no-torchao \
        --order batch --eager-batches 1,16 --budget-s 430   # b1 of every path, then b16, then b64

A full-depth run compiles the decode step once per path and batch (about 35 s each at 32 layers on an
H200); ``--budget-s`` skips the compiled cells that would not finish in time (the table and JSON say
what was skipped). Paths run in the order BF16, ``--presets`` in the order given (each on ours, then
cuBLASLt; unfused, then fused), torchao; ``--order batch`` runs every path at the first batch size
before any at the next, so a budget cuts the last batch sizes rather than the last paths.
``--eager-batches`` (or ``--skip-eager``: none) limits the eager decode to some batch sizes, and runs
split by ``--presets`` / ``--cublaslt`` / ``--no-torchao`` / ``--batches`` (BF16 is measured in every
call, so each table carries its own baseline). docs/serving.md has the commands of a full-depth run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import pathlib
import time
from dataclasses import dataclass

import torch

from benchmarks.common.budget import Budget
from benchmarks.common.cuda_clock import cuda_ms, is_cuda, linear_step_ms
from benchmarks.common.fp8_swap import calibrate, decoder_linears, forced_backend, fp8_layers, swap_in, torchao_layers
from benchmarks.common.generate_clock import reset_compiled, timed_generate
from benchmarks.common.greedy_compare import COMPARED_TOKENS, FirstScores, compare_greedy, describe_greedy
from benchmarks.common.random_model import MODELS, TINY, build_model, full_depth, prompt_ids
from benchmarks.common.results import RESULTS_DIR, environment, write_json
from benchmarks.common.weight_memory import weight_bytes
from fp8_linear import FP8Embedding, FP8Linear, fuse_projections, unfuse_projections
from fp8_linear.embedding import tie_to_head
from fp8_linear.fusion import launched_layers

PRESETS = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
QUICK = dict(models="llama3-8b", layers=2, presets="fp8-tensor,fp8-dynamic", cublaslt="fp8-dynamic",
             batches="1,16", new_tokens=64, reps=3)
#: ``--order``: each path at every batch size in turn, or every path at one batch size before the next.
ORDERS = ("path", "batch")
#: Sub-folder of the results folder where a JSON is written before it is renamed over the last one.
STAGING = ".staging"


# ------------------------------------------------------------------------------------------- paths
@dataclass(frozen=True)
class PathSpec:
    """One row of the table: ``kind`` ``bf16``, ``fp8`` (``preset`` on ``backend``, ``None``: the
    default choice; q/k/v and gate/up fused with ``fused``) or ``torchao``."""

    label: str
    kind: str
    preset: str | None = None
    backend: str | None = None
    fused: bool = False
    fp8_lm_head: bool = False  # --fp8-lm-head: lm_head an FP8Linear of the preset too
    fp8_embedding: bool = False  # --fp8-embedding: the input embedding an FP8Embedding


def plan_paths(presets: list[str], on_ours: list[str], on_cublaslt: list[str], fusions: list[bool],
               torchao: bool, fp8_lm_head: bool = False, fp8_embedding: bool = False) -> list[PathSpec]:
    """The rows of one model in run order: BF16, each preset in the order given (on ours, then cuBLASLt;
    each unfused, then fused, as ``fusions`` lists them), then torchao float8 if asked. ``fp8_lm_head`` /
    ``fp8_embedding``: the FP8 rows also quantize ``lm_head`` / the input embedding (labels ``+head``, ``+emb``)."""
    paths = [PathSpec("bf16", "bf16")]
    for preset in presets:
        for backend in ([None] if preset in on_ours else []) + (["cublaslt"] if preset in on_cublaslt else []):
            for fused in fusions:
                label = (f"{preset} {backend or 'ours'}" + (" fused" if fused else "") + (" +head" if fp8_lm_head else "")
                         + (" +emb" if fp8_embedding else ""))
                paths.append(PathSpec(label, "fp8", preset, backend, fused, fp8_lm_head, fp8_embedding))
    if torchao:
        paths.append(PathSpec("torchao float8 rowwise", "torchao"))
    return paths


class PathUnavailable(Exception):
    """A path that cannot run here (torchao not importable): a note instead of a row."""


@contextlib.contextmanager
def path_layers(model, path: PathSpec, bf16: dict, amax: dict[str, float]):
    """``model`` with ``path``'s decoder linears swapped in for the block, the BF16 ones (``bf16``) back
    after it; yields ``(held_bytes, info)``: GPU bytes held outside the model (the BF16 layers kept
    aside) and facts for the row (the fusion report)."""
    if path.kind == "bf16":
        try:
            yield 0, {}
        finally:
            reset_compiled(model)
        return
    kept: dict[str, torch.nn.Module] = {}
    with forced_backend(path.backend) if path.kind == "fp8" else contextlib.nullcontext():
        try:
            info = {}
            if path.kind == "fp8":
                swap_in(model, fp8_layers(bf16, path.preset, amax))
                ends = fp8_ends(model, path, amax)
                kept = {n: model.get_submodule(n) for n in ends}  # the BF16 lm_head / embedding, back after the path
                swap_in(model, ends)
                if path.fused:
                    report = fuse_projections(model)
                    info["fusion"] = dict(groups=len(report.fused), skipped=[f"{s.parent}: {s.reason}" for s in report.skipped])
            else:  # torchao quantizes in place: copies of the BF16 layers, so the originals serve the next path
                swap_in(model, {n: copy.deepcopy(m) for n, m in bf16.items()})
                why = torchao_layers(model)
                if why is not None:
                    raise PathUnavailable(why)
            yield weight_bytes([*bf16.values(), *kept.values()]), info
        finally:
            unfuse_projections(model)  # the parents' hooks go with it
            swap_in(model, bf16)
            swap_in(model, kept)
            reset_compiled(model)


def end_names(model) -> tuple[str, str]:
    """Qualified names of the output head and the input embedding (``lm_head``, ``model.embed_tokens``)."""
    names = {m: n for n, m in model.named_modules()}
    return names[model.get_output_embeddings()], names[model.get_input_embeddings()]


def head_input_amax(model, tokens: int = 512) -> float:
    """Input amax of ``lm_head`` over one forward of ``[1, tokens]`` random token ids (its static input scale)."""
    seen = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda m, a: seen.append(float(a[0].abs().amax())))
    try:
        with torch.inference_mode():
            model(torch.randint(0, model.config.vocab_size, (1, tokens), device=model.device))
    finally:
        hook.remove()
    return max(seen)


def fp8_ends(model, path: PathSpec, amax: dict[str, float]) -> dict[str, torch.nn.Module]:
    """The FP8 ``lm_head`` (``FP8Linear.from_linear`` of the path's preset, static input scale from
    ``amax[head name]``) and input embedding (``FP8Embedding.from_embedding``) the path asks for, by name;
    a tied pair shares one table (``tie_to_head``), as ``quantize_model`` keeps it."""
    head_name, emb_name = end_names(model)
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    out: dict[str, torch.nn.Module] = {}
    if path.fp8_lm_head:
        out[head_name] = FP8Linear.from_linear(head, path.preset, input_amax=amax.get(head_name))
    if path.fp8_embedding:
        out[emb_name] = FP8Embedding.from_embedding(emb)
        if path.fp8_lm_head and head.weight is emb.weight:
            tie_to_head(out[emb_name], out[head_name])
    return out


# ------------------------------------------------------------------------------------------- cells
def decode_cell(model, ids: torch.Tensor, new: int, compiled: bool, reps: int,
                skip_guards: bool = False) -> tuple[dict, torch.Tensor, list]:
    """Timings of greedy ``generate`` of ``new`` tokens on ``ids`` (eager dynamic cache, or compiled static
    cache), plus the first :data:`COMPARED_TOKENS` tokens and their logits (for :func:`compare_greedy`).

    Compiled: the first call compiles and captures (its duration is ``compile_s``) and records the logits;
    then ``reps`` timed calls (the fastest kept) and the replayed forward. Eager: a short first call
    records the logits, then the timed calls. ``reps = 0``: only the tokens (an empty timing dict).
    ``skip_guards`` (compiled only): ``reps`` more timed calls of the same compiled code under
    ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` (dynamo evaluates only the guards that tell
    its cached entries apart), the fastest kept as ``cell["skip_guards"]`` with its tokens' agreement.
    """
    kw = dict(cache_implementation="static") if compiled else dict(disable_compile=True)
    first = FirstScores(min(COMPARED_TOKENS, new))
    with torch.inference_mode():
        t0 = time.perf_counter()
        _, tokens = timed_generate(model, ids, new if compiled else first.n, kw, first)
        warm_s = time.perf_counter() - t0
        runs = [timed_generate(model, ids, new, kw)[0] for _ in range(reps)]
    if not runs:  # only the tokens were asked for
        return {}, tokens[:, :first.n], first.scores
    cell = fastest(runs, ids.shape[0])
    if compiled:
        cell["compile_s"] = warm_s
    if compiled and skip_guards:
        cell["skip_guards"] = guards_skipped_cell(model, ids, new, kw, reps, tokens)
    return cell, tokens[:, :first.n], first.scores


def fastest(runs: list[dict], batch: int) -> dict:
    """The run of ``runs`` (:func:`timed_generate` timings) with the shortest step, with its tokens/s."""
    best = min(runs, key=lambda r: r.get("step_ms", float("inf")))
    return dict(best, decode_tok_s=batch / best["step_ms"] * 1e3 if best.get("step_ms") else None)


def guards_skipped_cell(model, ids: torch.Tensor, new: int, kw: dict, reps: int, tokens: torch.Tensor) -> dict:
    """``reps`` timed compiled ``generate`` calls (already compiled and captured) under
    ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``: the fastest (:func:`fastest`), and whether
    its ``new`` tokens equal ``tokens`` (those of the same compiled code with every guard evaluated)."""
    runs, same = [], True
    with torch.inference_mode(), torch.compiler.set_stance(skip_guard_eval_unsafe=True):
        for _ in range(reps):
            timing, out = timed_generate(model, ids, new, kw)
            runs.append(timing)
            same = same and torch.equal(out, tokens)
    return dict(fastest(runs, ids.shape[0]), same_tokens_as_guarded=same)


def error_text(e: BaseException, width: int = 200) -> str:
    """``Type: first line of the message`` (cut at ``width`` characters), for a cell or row that failed."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:width] if str(e) else ''}"


def measure_batch(model, batch: int, args, clock: Budget | None, eager: bool, calls: list, device,
                  compiles: int = 1, skip_compiled: str | None = None, path: str | None = None) -> dict:
    """The decode cell of one batch size: eager (if ``eager``) and compiled ``generate``, the greedy
    comparison of the two, and the compiled step's split into the linear layers (``calls``: the GEMMs a
    forward launches) and the rest. The compiled cell runs only if ``clock`` has room for ``compiles``
    compiles (2 for the baseline: itself and one to compare it with) and no ``skip_compiled`` reason is
    given, else it is recorded as skipped with the reason; ``path`` (the row's label) keys the clock's
    compile estimate."""
    cell, greedy = {}, {}
    ids = prompt_ids(model.config.vocab_size, batch, args.prompt, device)
    for mode, compiled in (("eager", False), ("compiled", True)):
        if mode == "eager" and not eager:
            continue
        if compiled and skip_compiled is not None:
            cell[mode] = dict(error=f"skipped: {skip_compiled}")
            continue
        if compiled and clock is not None and not clock.allows_compile(compiles, path):
            cell[mode] = dict(error=f"skipped: {clock.why(path)}")
            continue
        reset_compiled(model)
        try:
            cell[mode], *greedy[mode] = decode_cell(model, ids, args.new_tokens, compiled, max(1, args.reps),
                                                    skip_guards=args.skip_guards)
            if compiled and clock is not None:
                clock.compiled(cell[mode].get("compile_s", 0.0), path)
        except Exception as e:  # noqa: BLE001 - a path that cannot run is reported, not fatal
            cell[mode] = dict(error=error_text(e))
    if "eager" not in greedy and "compiled" in greedy:
        # no eager cell at this batch: the eager reference tokens still come from a short eager run
        with contextlib.suppress(Exception):
            _, *greedy["eager"] = decode_cell(model, ids, min(COMPARED_TOKENS, args.new_tokens), False, 0)
    cmp = compare_greedy(*greedy["eager"], *greedy["compiled"]) if len(greedy) == 2 else None
    cell["greedy"] = cmp
    # rows (sequences of the batch) whose first COMPARED_TOKENS greedy tokens agree, compiled vs eager
    cell["same_tokens_rows"] = cmp["rows"] if cmp else None
    try:
        lin_ms = linear_step_ms(calls, batch, device)
    except Exception as e:  # noqa: BLE001 - e.g. layers that cannot be captured in a CUDA graph
        lin_ms, cell["linear_error"] = None, error_text(e)
    step = cell.get("compiled", {}).get("step_ms")
    cell["linear_ms"] = lin_ms
    cell["rest_ms"] = None if step is None or lin_ms is None else step - lin_ms
    return cell


def path_facts(model, label: str, kind: str, args, device) -> dict:
    """The row's batch-independent facts: backends, weight memory, linear calls a forward launches, and
    prefill tokens/s (one ``[1, --prefill]`` forward with ``logits_to_keep=1``, median of ``--reps``) with
    the forward's split into the decoder's linear layers at M = ``--prefill`` (``prefill_linear_ms``:
    :func:`linear_step_ms`) and the rest (``prefill_rest_ms``). The split's inputs (one ``[--prefill, K]``
    activation per layer) are not the path's memory: the peak counter restarts after it."""
    lin = list(decoder_linears(model).values())
    backends = sorted({m.backend for m in lin if isinstance(m, FP8Linear)}) or [kind]
    calls = launched_layers(lin)
    row = dict(path=label, backends=backends, weight_gb=weight_bytes([model]) / 1e9,
               linear_weight_gb=weight_bytes(lin) / 1e9, linear_calls=len(calls), decode={})
    try:
        row["prefill_linear_ms"] = linear_step_ms(calls, args.prefill, device)
    except Exception as e:  # noqa: BLE001 - e.g. layers that cannot be captured in a CUDA graph
        row["prefill_linear_ms"], row["prefill_linear_error"] = None, error_text(e)
    if is_cuda(device):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    ids = torch.randint(0, model.config.vocab_size, (1, args.prefill), device=device)
    with torch.inference_mode():
        prefill_ms = cuda_ms(lambda: model(ids, logits_to_keep=1), max(1, args.reps), device)
    row["prefill_tok_s"] = args.prefill / prefill_ms * 1e3
    row["prefill_ms"] = prefill_ms
    lin_ms = row["prefill_linear_ms"]
    row["prefill_rest_ms"] = None if lin_ms is None else prefill_ms - lin_ms
    return row


def prefill_ceiling(row: dict, base: dict) -> float | None:
    """The prefill speed-up over ``base`` (the BF16 row) that ``row``'s linear layers allow with BF16's
    rest of the forward: BF16's forward ms / (BF16's rest + ``row``'s linear ms); None without the split."""
    lin, rest, total = row.get("prefill_linear_ms"), base.get("prefill_rest_ms"), base.get("prefill_ms")
    if not lin or rest is None or not total:
        return None
    return total / (rest + lin)


def run_phase(model, label: str, row: dict, batches: list[int], args, clock, device, held_bytes: int,
              checkpoint, baseline: bool = False, base: dict | None = None) -> None:
    """Measure the path ``label`` (its layers swapped in) at ``batches``: each cell goes into
    ``row["decode"]`` and ``checkpoint()`` saves it at once; then the peak GPU memory since the last
    ``reset_peak_memory_stats`` less ``held_bytes`` (memory outside the model), the largest over phases.
    A ``baseline`` path's compiled cell needs budget for itself and one path to compare it with; a
    compiled cell of another path whose baseline cell (in ``base``, the baseline's row) was skipped is
    skipped too (nothing to compare it with)."""
    calls = launched_layers(list(decoder_linears(model).values()))  # fused groups as the one GEMM each a forward launches
    for b in batches:
        base_error = str(((base or {}).get("decode", {}).get(str(b)) or {}).get("compiled", {}).get("error", ""))
        skip = "no BF16 compiled cell at this batch to compare with" if base_error.startswith("skipped") else None
        row["decode"][str(b)] = cell = measure_batch(model, b, args, clock, b in args.eager_batches, calls, device,
                                                     2 if baseline else 1, skip, label)
        checkpoint()  # before the line: a printed cell is on disk
        print(f"  {label} batch {b}: {fmt_cell(cell)}", flush=True)
    if is_cuda(device):
        peak = (torch.cuda.max_memory_allocated(device) - held_bytes) / 1e9
        row["peak_gb"] = max(peak, row.get("peak_gb") or 0.0)
    else:
        row["peak_gb"] = float("nan")


# ------------------------------------------------------------------------------------------- report
def fmt_cell(cell: dict) -> str:
    """One line of a decode cell: tok/s, step, TTFT (and compile) per mode, the step's split, the greedy check."""
    parts = []
    for mode in ("eager", "compiled"):
        c = cell.get(mode)
        if c is None:
            continue
        if c.get("decode_tok_s"):
            extra = f", compile + first call {c['compile_s']:.0f} s, first step {c['first_step_ms']:.1f} ms" if "compile_s" in c else ""
            parts.append(f"{mode} {c['decode_tok_s']:.0f} tok/s (step {c['step_ms']:.2f} ms, TTFT {c['ttft_ms']:.0f} ms{extra})")
        else:
            parts.append(f"{mode} {c.get('error', '-')}")
    comp = cell.get("compiled", {})
    if comp.get("skip_guards", {}).get("decode_tok_s"):
        sg = comp["skip_guards"]
        parts.append(f"guards skipped {sg['decode_tok_s']:.0f} tok/s (step {sg['step_ms']:.2f} ms,"
                     f" tokens as with all guards: {sg['same_tokens_as_guarded']})")
    if cell.get("rest_ms") is not None:
        parts.append(f"step {comp['step_ms']:.2f} ms = linear {cell['linear_ms']:.2f} + rest {cell['rest_ms']:.2f}")
    parts.append(describe_greedy(cell.get("greedy")))
    return "; ".join(parts)


def print_table(model_name: str, layers: int, prefill: int, rows: list[dict], batches: list[int]) -> None:
    """The table of one model: per row prefill and, per batch, eager / compiled tok/s with x BF16 (the
    first row), the compiled step's linear ms (x BF16's) and rest ms, greedy rows identical; memory."""
    base = rows[0]
    print(f"\n{model_name}-shaped, {layers} decoder layers, random weights; prefill of {prefill} tokens;"
          f" decode after a prompt: tok/s and x BF16 per batch (eager, compiled static cache); the compiled step split"
          f" into the linear layers (ms, BF16's / ours), and the rest of the step (ms);"
          f" greedy: rows whose first {COMPARED_TOKENS} tokens compiled == eager")

    def tps(cell, mode):
        return (cell.get(mode) or {}).get("decode_tok_s")

    def ratio(a, b_):
        return f"{a / b_:>5.2f}" if a and b_ else f"{'-':>5}"

    def num(v, width=6, prec=2):
        return f"{v:>{width}.{prec}f}" if isinstance(v, (int, float)) and v == v else f"{'-':>{width}}"

    head = f"{'path':<22} {'backend':<10} {'prefill tok/s':>13} {'x':>5}"
    for b in batches:
        head += f" | b{b} eager {'x':>5} compiled {'x':>5} lin ms  x   rest ms  greedy"
    print(head + " | weights GB (linears)  peak GB")
    for r in rows:
        if "error" in r:
            print(f"{r['path']:<22} {r['error']}")
            continue
        line = (f"{r['path']:<22} {','.join(r['backends']):<10} {num(r.get('prefill_tok_s'), 13, 0)}"
                f" {ratio(r.get('prefill_tok_s'), base.get('prefill_tok_s'))}")
        for b in batches:
            c, c0 = r["decode"].get(str(b), {}), base.get("decode", {}).get(str(b), {})
            e, ce = tps(c, "eager"), tps(c, "compiled")
            line += (f" | {num(e, 8, 0)} {ratio(e, tps(c0, 'eager'))} {num(ce, 8, 0)} {ratio(ce, tps(c0, 'compiled'))}"
                     f" {num(c.get('linear_ms'))} {ratio(c0.get('linear_ms'), c.get('linear_ms'))} {num(c.get('rest_ms'), 9)}"
                     f"  {c.get('same_tokens_rows') or '-':>6}")
        print(line + f" | {r['weight_gb']:>6.2f} ({r['linear_weight_gb']:.2f}) {num(r.get('peak_gb'), 8, 1)}")
    print_skipped_guards(rows, batches, ratio, num)
    print_prefill_split(rows, prefill, ratio, num)


def print_prefill_split(rows: list[dict], prefill: int, ratio, num) -> None:
    """Per row: the prefill forward's ms split into the linear layers (x BF16's) and the rest, its speed-up,
    and the speed-up BF16's rest would leave it (:func:`prefill_ceiling`)."""
    base = rows[0]
    if base.get("prefill_rest_ms") is None:
        return
    print(f"prefill of {prefill} tokens: forward ms = linear layers (x BF16's) + rest; x BF16; the ceiling with"
          f" BF16's rest")
    for r in rows:
        if "error" in r or r.get("prefill_ms") is None:
            continue
        ceil = prefill_ceiling(r, base)
        print(f"  {r['path']:<22} {num(r['prefill_ms'], 7)} = {num(r.get('prefill_linear_ms'), 6)}"
              f" ({ratio(base.get('prefill_linear_ms'), r.get('prefill_linear_ms'))}) + {num(r.get('prefill_rest_ms'), 6)}"
              f"  x {ratio(base['prefill_ms'], r['prefill_ms'])}  ceiling {num(ceil, 5)}")


def print_skipped_guards(rows: list[dict], batches: list[int], ratio, num) -> None:
    """With ``--skip-guards``: per row and batch, compiled tok/s with dynamo's guards skipped, x BF16's in the
    same mode, the step's change against every guard evaluated (ms), and whether the tokens agree."""
    if not any("skip_guards" in ((r.get("decode", {}).get(str(b)) or {}).get("compiled") or {}) for r in rows for b in batches):
        return
    print("compiled, guards skipped (torch.compiler.set_stance(skip_guard_eval_unsafe=True)): tok/s, x BF16's,"
          " step ms against all guards evaluated, tokens the same as with all guards")
    base = rows[0]
    for r in rows:
        if "decode" not in r:  # a path that could not run (its error is in the main table)
            continue
        line = f"{r['path']:<22} {','.join(r['backends']):<10}"
        for b in batches:
            c, c0 = (r["decode"].get(str(b)) or {}), (base.get("decode", {}).get(str(b)) or {})
            sg, sg0 = (c.get("compiled") or {}).get("skip_guards") or {}, (c0.get("compiled") or {}).get("skip_guards") or {}
            full = (c.get("compiled") or {}).get("step_ms")
            delta = sg["step_ms"] - full if sg.get("step_ms") and full else None
            line += (f" | b{b} {num(sg.get('decode_tok_s'), 8, 0)} {ratio(sg.get('decode_tok_s'), sg0.get('decode_tok_s'))}"
                     f" {num(delta, 6)} {str(sg.get('same_tokens_as_guarded', '-')):>5}")
        print(line)


def save(results: dict, notes: list[str], args, previous: pathlib.Path | None = None) -> pathlib.Path:
    """Write the JSON of everything measured so far: staged in ``<out>/.staging`` and renamed over
    ``previous`` (the file of the first call, whose name it keeps), so the file on disk is always whole."""
    out = pathlib.Path(args.out) if args.out else RESULTS_DIR
    staged = write_json("e2e", environment({"args": vars(args), "notes": notes}),
                        {m: {r["path"]: r.get("decode") for r in v["rows"]} for m, v in results.items()},
                        [dict(model=m, **r) for m, v in results.items() for r in v["rows"]], out / STAGING,
                        "quick" if args.quick else "")
    final = previous if previous is not None else out / staged.name
    os.replace(staged, final)
    with contextlib.suppress(OSError):
        staged.parent.rmdir()
    return final


# ------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``--quick`` applied), with ``batches`` and ``eager_batches`` as lists of ints;
    ``SystemExit`` (argparse's error) for an eager batch size that is not in ``--batches``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's full depth)")
    ap.add_argument("--presets", default=",".join(PRESETS), help="FP8 presets, run in this order")
    ap.add_argument("--ours", default=None, help="presets run on the default backend (default: every preset)")
    ap.add_argument("--cublaslt", default=None, help="presets also run on cuBLASLt (default: every preset)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--eager-batches", default=None,
                    help="batch sizes with an eager decode cell (default: every one of --batches; '' none)")
    ap.add_argument("--order", choices=ORDERS, default="path",
                    help="path (default): each path at every batch size, then the next path; batch: every path at "
                         "the first batch size, then every path at the next (a --budget-s run then loses the last "
                         "batch sizes, not the last paths)")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-torchao", action="store_true")
    ap.add_argument("--fuse", action="store_true",
                    help="FP8 paths with fused q/k/v and gate/up GEMMs (fp8_linear.fuse_projections): rows '<preset> <backend> fused'")
    ap.add_argument("--no-fuse", action="store_true",
                    help="FP8 paths unfused (the default without --fuse); give both flags for both rows of each path")
    ap.add_argument("--fp8-lm-head", action="store_true",
                    help="FP8 paths also quantize lm_head (FP8Linear of the preset, counted in weights GB, timed in the rest)")
    ap.add_argument("--fp8-embedding", action="store_true",
                    help="FP8 paths also store the input embedding in FP8 (FP8Embedding: e4m3 rows, a scale per row)")
    ap.add_argument("--skip-guards", action="store_true",
                    help="also time each compiled cell under torch.compiler.set_stance(skip_guard_eval_unsafe=True)")
    ap.add_argument("--skip-eager", action="store_true",
                    help="no eager decode cell at any batch size (--eager-batches ''); the 32 eager reference tokens still run")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock budget: compiled cells that would not finish in time are skipped (and listed)")
    ap.add_argument("--compile-guess-s", type=float, default=60.0,
                    help="with --budget-s: the compile time assumed before the first one is measured")
    ap.add_argument("--reserve-s", type=float, default=30.0,
                    help="with --budget-s: seconds kept after the last compile (eager reference tokens, linear split, JSON)")
    ap.add_argument("--quick", action="store_true", help="a short run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--tiny", action="store_true", help="small models of the same architectures (checks the script)")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only with --tiny, to check the script")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)

    def sizes(text: str, flag: str) -> list[int]:
        try:
            out = [int(b) for b in str(text).split(",") if b.strip()]
        except ValueError:
            ap.error(f"{flag} {text!r}: expected comma-separated batch sizes")
        if any(b < 1 for b in out):
            ap.error(f"{flag} {text!r}: batch sizes must be >= 1")
        return out

    args.batches = sizes(args.batches, "--batches")
    if not args.batches:
        ap.error("--batches: expected at least one batch size")
    if args.skip_eager and args.eager_batches not in (None, ""):
        ap.error("--skip-eager and --eager-batches: give one of them")
    eager = [] if args.skip_eager else (args.batches if args.eager_batches is None else sizes(args.eager_batches, "--eager-batches"))
    if set(eager) - set(args.batches):
        ap.error(f"--eager-batches {sorted(set(eager) - set(args.batches))} not in --batches {args.batches}")
    args.eager_batches = eager
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = args.device
    if is_cuda(device) and not torch.cuda.is_available():
        raise SystemExit("benchmarks/e2e.py needs a CUDA GPU (or --tiny --device cpu)")
    presets = [p for p in args.presets.split(",") if p]
    on_cublaslt = presets if args.cublaslt is None else [p for p in args.cublaslt.split(",") if p]
    on_ours = presets if args.ours is None else [p for p in args.ours.split(",") if p]
    fusions = ([False] if args.no_fuse or not args.fuse else []) + ([True] if args.fuse else [])
    paths = plan_paths(presets, on_ours, on_cublaslt, fusions, not args.no_torchao, args.fp8_lm_head, args.fp8_embedding)
    phases = [args.batches] if args.order == "path" else [[b] for b in args.batches]
    notes, results, saved = [], {}, None
    clock = Budget(args.budget_s, args.compile_guess_s, args.reserve_s)

    def checkpoint():
        nonlocal saved
        saved = save(results, notes, args, saved)

    for name in args.models.split(","):
        model = build_model(name, args.layers, device, args.tiny)
        layers = model.config.num_hidden_layers
        if layers != full_depth(name, args.tiny):
            notes.append(f"{name}: {layers} of {full_depth(name, args.tiny)} decoder layers (--layers)")
        bf16 = dict(decoder_linears(model))
        amax = calibrate(model)
        if args.fp8_lm_head:
            amax[end_names(model)[0]] = head_input_amax(model)
        results[name] = dict(layers=layers, rows=[])
        rows: dict[str, dict] = {}  # label -> row (also in results[name]["rows"] once it has been measured)
        for batches in phases:
            for path in paths:
                row = rows.get(path.label)
                if row is not None and ("error" in row or "phase_error" in row):
                    continue  # it failed in an earlier phase
                try:
                    with path_layers(model, path, bf16, amax) as (held, info):
                        if is_cuda(device):
                            torch.cuda.reset_peak_memory_stats(device)
                        if row is None:
                            row = rows[path.label] = dict(path_facts(model, path.label, path.kind, args, device), **info)
                            results[name]["rows"].append(row)
                            checkpoint()
                        run_phase(model, path.label, row, batches, args, clock, device, held, checkpoint,
                                  baseline=path is paths[0] and len(paths) > 1,
                                  base=None if path is paths[0] else rows.get(paths[0].label))
                except PathUnavailable as e:  # a note, not a row
                    rows[path.label] = dict(path=path.label, error=str(e))
                    if f"torchao column skipped: {e}" not in notes:
                        notes.append(f"torchao column skipped: {e}")
                except Exception as e:  # noqa: BLE001 - e.g. a forced backend that cannot run a preset
                    if row is None:
                        rows[path.label] = row = dict(path=path.label, error=error_text(e, 300))
                        results[name]["rows"].append(row)
                    else:
                        row["phase_error"] = f"batches {batches}: {error_text(e, 300)}"
                checkpoint()
        shown = results[name]["rows"]
        print_table(name, layers, args.prefill, shown, args.batches)
        for r in shown:
            for b, cell in (r.get("decode") or {}).items():
                print(f"  greedy, {r['path']}, batch {b}: {describe_greedy(cell.get('greedy'))}")
        del model, bf16
        reset_compiled(None)
    for n in notes:
        print("note:", n)
    print(f"total {time.perf_counter() - clock.t0:.0f} s")
    checkpoint()
    print(f"wrote {saved}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
