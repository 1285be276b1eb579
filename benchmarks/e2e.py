"""End-to-end serving benchmark: Llama-3-8B- and Qwen2.5-7B-shaped models, BF16 against each FP8 path.

Models are built from a config with random weights (full depth by default: 32 / 28 decoder layers;
``--layers`` cuts them, and the table says so). Each decoder ``nn.Linear`` becomes
``FP8Linear.from_linear`` (static presets calibrated by one forward pass on random tokens); the
embeddings, norms and ``lm_head`` stay BF16. Paths: ``bf16``; every preset on the default backend
(``ours``: the sm90 kernel where it runs the layer) and on cuBLASLt (``FP8_LINEAR_BACKEND=cublaslt``);
torchao float8 (``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``: dynamic per-row
activations and weights, what a transformers user picks with ``TorchAoConfig``) when ``torchao``
imports (install the wheel first: ``pip install --no-deps .whl/torchao-*.whl``), else a note.
With ``--fuse`` each FP8 path also runs (or, without ``--no-fuse``, only runs) with its q/k/v and
gate/up projections fused into one GEMM each (``fp8_linear.fuse_projections``; rows ``<preset>
<backend> fused``; the linear-layer split then times the fused GEMMs a forward launches).

Per path and model:

- prefill tokens/s: one forward of ``[1, --prefill]`` tokens with ``logits_to_keep=1`` as ``generate``
  runs it (CUDA events, median of ``--reps``);
- decode at each ``--batches`` size: greedy ``generate`` of ``--new-tokens`` tokens after a
  ``--prompt``-token prompt, eager (dynamic cache) and compiled static cache (``cache_implementation=
  "static"``: transformers compiles the decode step, CUDA graphs). A streamer stamps every token
  (benchmarks/e2e_decode.py): TTFT is the first token's time, the decode step the median interval
  between tokens (garbage collection off), tokens/s = batch / step; the first decode step of each
  compiled call (it re-records the CUDA graph for the call's new static cache) is reported apart;
- the compiled decode step split three ways: the decoder's linear layers (GEMM + activation
  quantization: the same layers called in order at M = batch, replayed from one CUDA graph), the rest
  of the compiled forward (attention, norms, rotary, embeddings, ``lm_head``: transformers' compiled
  step replayed back to back with its last arguments, minus the linear layers), and ``generate``'s
  loop around it (sampling, stopping checks, the per-token synchronization: step - forward); the host
  time of one compiled forward call (guards, CUDA-graph replay) is printed beside it;
- weight memory (all parameters, and the decoder linears alone) and peak GPU memory (of the path's
  model: the BF16 linear layers kept aside while an FP8 path runs are left out);
- the first 32 greedy tokens of each compiled run against eager's, per sequence of the batch, and
  where they diverge, by how much the logits of the two runs differ there (random weights give
  near-flat logits, so tokens flip at near-ties; BF16's own row says how often the model itself does).

Writes a table and ``benchmarks/results/e2e-<UTC stamp>[-quick].json`` (rewritten after every path,
so a run stopped by a time limit keeps what it measured).

    python -m benchmarks.e2e                      # full depth, both models, every path
    python -m benchmarks.e2e --quick              # ~4 minutes on an H200: 2 layers of the 8B shape
    python -m benchmarks.e2e --models llama3-8b --presets fp8-dynamic --cublaslt fp8-dynamic --budget-s 500
    python -m benchmarks.e2e --models llama3-8b --presets fp8-tensor --cublaslt "" --fuse --no-fuse  # both rows

A full-depth run compiles the decode step once per path and batch (tens of seconds each at 32
layers); ``--budget-s`` skips what would not finish in time (the table and JSON say what was
skipped), ``--skip-eager`` leaves out the eager decode, and runs split by ``--presets`` / ``--cublaslt``
/ ``--no-torchao`` / ``--batches`` (BF16 is measured in every call, so each table carries its own
baseline). docs/serving.md has the commands of a full-depth run in two calls.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time

import torch
from torch import nn

from fp8_linear import FP8Linear, fuse_projections, settings, unfuse_projections
from fp8_linear.fusion import launched_layers

try:
    from benchmarks.e2e_decode import COMPARED_TOKENS, FirstScores, compare_greedy, describe_greedy, timed_generate
except ImportError:  # run as a script from benchmarks/
    from e2e_decode import COMPARED_TOKENS, FirstScores, compare_greedy, describe_greedy, timed_generate  # type: ignore

#: Config fields of the two model shapes (public config.json values).
MODELS = {
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256, rope_theta=500000.0,
                      max_position_embeddings=8192, rms_norm_eps=1e-5),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                       num_key_value_heads=4, num_hidden_layers=28, vocab_size=152064, rope_theta=1000000.0,
                       max_position_embeddings=32768, rms_norm_eps=1e-6),
}
PRESETS = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
QUICK = dict(models="llama3-8b", layers=2, presets="fp8-tensor,fp8-dynamic", cublaslt="fp8-dynamic",
             batches="1,16", new_tokens=64, reps=3)
#: ``--tiny``: a small model of the same architecture, to check the script itself (also on a CPU).
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=1024, num_hidden_layers=2)
DEVICE = "cuda"


# ------------------------------------------------------------------------------------------- models
def build_model(name: str, layers: int | None, tiny: bool = False):
    """A BF16 ``*ForCausalLM`` of the named shape with random weights on :data:`DEVICE`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(MODELS[name], **(TINY if tiny else {}))
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    if layers:
        cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def decoder_linears(model) -> dict[str, nn.Module]:
    """The decoder's linear layers (``nn.Linear`` or ``FP8Linear``), ``lm_head`` excluded, in order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, (nn.Linear, FP8Linear)) and "lm_head" not in n}


def calibrate(model, tokens: int = 512) -> dict[str, float]:
    """Input amax of each decoder linear over one forward of random tokens (static presets)."""
    amax: dict[str, float] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, a, n=n: amax.__setitem__(n, max(amax.get(n, 0.0), float(a[0].abs().amax()))))
             for n, m in decoder_linears(model).items()]
    with torch.inference_mode():
        model(torch.randint(0, model.config.vocab_size, (1, tokens), device=DEVICE))
    for h in hooks:
        h.remove()
    return amax


def swap_in(model, modules: dict[str, nn.Module]) -> None:
    for name, mod in modules.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, mod)


def fp8_layers(bf16: dict[str, nn.Linear], preset: str, amax: dict[str, float]) -> dict[str, FP8Linear]:
    return {n: FP8Linear.from_linear(lin, preset, input_amax=amax[n]) for n, lin in bf16.items()}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes held by ``t``; a tensor subclass (torchao's float8 weights) by its inner tensors."""
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def weight_bytes(modules) -> int:
    return sum(tensor_bytes(t) for m in modules for t in [*m.parameters(), *m.buffers()])


# ------------------------------------------------------------------------------------------- timing
def _cuda() -> bool:
    return torch.device(DEVICE).type == "cuda"


def sync() -> None:
    if _cuda():
        torch.cuda.synchronize()


def cuda_ms(fn, reps: int) -> float:
    """Median ms of ``fn()`` over ``reps`` runs after one warm-up (CUDA events; wall time off CUDA)."""
    fn()
    times = []
    for _ in range(reps):
        if not _cuda():
            times.append(wall_s(fn) * 1e3)
            continue
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def wall_s(fn) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def prompt_ids(vocab: int, batch: int, prompt: int) -> torch.Tensor:
    """The same random prompt for every path and mode of one batch size."""
    g = torch.Generator().manual_seed(batch * 7919 + prompt)
    return torch.randint(0, vocab, (batch, prompt), generator=g).to(DEVICE)


def decode_cell(model, ids: torch.Tensor, new: int, compiled: bool, reps: int) -> tuple[dict, torch.Tensor, list]:
    """Timings of greedy ``generate`` of ``new`` tokens on ``ids`` (eager dynamic cache, or compiled static
    cache), plus the first :data:`COMPARED_TOKENS` tokens and their logits (for :func:`compare_greedy`).

    Compiled: the first call compiles and captures (its duration is ``compile_s``) and records the logits;
    then ``reps`` timed calls (the fastest kept) and the replayed forward. Eager: a short first call
    records the logits, then the timed calls.
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
    best = min(runs, key=lambda r: r.get("step_ms", float("inf")))
    cell = dict(best, decode_tok_s=ids.shape[0] / best["step_ms"] * 1e3 if best.get("step_ms") else None,
                **({"compile_s": warm_s} if compiled else {}))
    return cell, tokens[:, :first.n], first.scores


def linear_step_ms(modules: list[nn.Module], batch: int) -> float:
    """GPU ms of calling ``modules`` in order at ``M = batch`` (one decode step's linear layers), replayed
    from one CUDA graph: each layer's GEMM and activation quantization, nothing else."""
    xs = [torch.randn(batch, m.in_features, device=DEVICE, dtype=torch.bfloat16) for m in modules]

    def step():
        for m, x in zip(modules, xs):
            m(x)

    if not _cuda():
        with torch.inference_mode():
            return cuda_ms(step, 3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(side):
        step()
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        step()
    return cuda_ms(graph.replay, 10)


# ------------------------------------------------------------------------------------------- paths
@contextlib.contextmanager
def forced_backend(name: str | None):
    """``FP8_LINEAR_BACKEND=name`` for the block (``None``: the default choice), settings re-read."""
    import os

    old = os.environ.get(settings.BACKEND_ENV)
    if name:
        os.environ[settings.BACKEND_ENV] = name
    else:
        os.environ.pop(settings.BACKEND_ENV, None)
    settings.reload()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(settings.BACKEND_ENV, None)
        else:
            os.environ[settings.BACKEND_ENV] = old
        settings.reload()


def reset_compiled(model) -> None:
    """Forget compiled code (dynamo's caches and transformers' compiled decode step) and free memory."""
    torch._dynamo.reset()
    if model is not None:
        for attr in ("_compiled_call", "_last_compile_config"):
            model.__dict__.pop(attr, None)
    gc.collect()
    if _cuda():
        torch.cuda.empty_cache()


def run_path(model, label: str, args, batches: list[int], clock=None, kind: str = "bf16", held_bytes: int = 0) -> dict:
    """Every measurement of one path on ``model`` as it is now (its linear layers already swapped in).
    ``clock`` (a :class:`Budget`) skips the compiled cells that would not finish in time; ``kind`` names
    the linear layers when they are not ``FP8Linear`` (``bf16``, ``torchao``); ``held_bytes``: GPU memory
    held outside the model (the BF16 linear layers kept for the next path), left out of the peak."""
    lin = list(decoder_linears(model).values())
    backends = sorted({m.backend for m in lin if isinstance(m, FP8Linear)}) or [kind]
    calls = launched_layers(lin)  # fused groups (--fuse) as the one GEMM each that a forward launches
    row = dict(path=label, backends=backends, weight_gb=weight_bytes([model]) / 1e9,
               linear_weight_gb=weight_bytes(lin) / 1e9, linear_calls=len(calls))
    if _cuda():
        torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(0, model.config.vocab_size, (1, args.prefill), device=DEVICE)
    with torch.inference_mode():
        row["prefill_tok_s"] = args.prefill / cuda_ms(lambda: model(ids, logits_to_keep=1), args.reps) * 1e3
    row["decode"] = {}
    for b in batches:
        cell, greedy = {}, {}
        ids = prompt_ids(model.config.vocab_size, b, args.prompt)
        for mode, compiled in (("eager", False), ("compiled", True)):
            if mode == "eager" and args.skip_eager:
                continue
            if compiled and clock is not None and not clock.allows_compile():
                cell[mode] = dict(error=f"skipped: {clock.why()}")
                continue
            reset_compiled(model)
            try:
                cell[mode], *greedy[mode] = decode_cell(model, ids, args.new_tokens, compiled, max(1, args.reps))
                if compiled and clock is not None:
                    clock.compiled(cell[mode].get("compile_s", 0.0))
            except Exception as e:  # noqa: BLE001 - a path that cannot run is reported, not fatal
                cell[mode] = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        if "eager" not in greedy and "compiled" in greedy:
            # --skip-eager: the eager reference tokens still come from a short eager run
            with contextlib.suppress(Exception):
                _, *greedy["eager"] = decode_cell(model, ids, min(COMPARED_TOKENS, args.new_tokens), False, 0)
        cmp = compare_greedy(*greedy["eager"], *greedy["compiled"]) if len(greedy) == 2 else None
        cell["greedy"] = cmp
        # rows (sequences of the batch) whose first COMPARED_TOKENS greedy tokens agree, compiled vs eager
        cell["same_tokens_rows"] = cmp["rows"] if cmp else None
        try:
            lin_ms = linear_step_ms(calls, b)
        except Exception as e:  # noqa: BLE001 - e.g. layers that cannot be captured in a CUDA graph
            lin_ms, cell["linear_error"] = None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        comp = cell.get("compiled", {})
        step = comp.get("step_ms")
        cell["linear_ms"] = lin_ms
        cell["rest_ms"] = None if step is None or lin_ms is None else step - lin_ms
        row["decode"][str(b)] = cell
        print(f"  {label} batch {b}: {fmt_cell(cell)}", flush=True)
    row["peak_gb"] = (torch.cuda.max_memory_allocated() - held_bytes) / 1e9 if _cuda() else float("nan")
    reset_compiled(model)
    return row


class Budget:
    """Wall-clock budget of a run: a compiled cell starts only if the slowest compile seen so far (or
    :attr:`first_guess_s` before any) still fits, with :attr:`reserve_s` left for the rest."""

    def __init__(self, seconds: float | None, first_guess_s: float, reserve_s: float = 30.0):
        self.seconds, self.first_guess_s, self.reserve_s = seconds, first_guess_s, reserve_s
        self.t0 = time.perf_counter()
        self.slowest = 0.0

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (time.perf_counter() - self.t0)

    def allows_compile(self) -> bool:
        return self.left() > (self.slowest or self.first_guess_s) + self.reserve_s

    def compiled(self, seconds: float) -> None:
        self.slowest = max(self.slowest, seconds)

    def why(self) -> str:
        return f"--budget-s {self.seconds:.0f}: {max(self.left(), 0):.0f} s left, a compile took up to {self.slowest or self.first_guess_s:.0f} s"


def torchao_layers(model):
    """Quantize ``model``'s decoder linears with torchao float8 (dynamic per-row), or return the reason it cannot."""
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except Exception as e:  # noqa: BLE001 - torchao absent or too old
        return (f"torchao not importable ({type(e).__name__}: {e}); install the wheel first: "
                f"pip install --no-deps .whl/torchao-*.whl")
    try:
        quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
                  filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
    except Exception as e:  # noqa: BLE001 - e.g. no FP8 GPU
        return f"torchao float8 could not quantize the model ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    return None


# ------------------------------------------------------------------------------------------- report
def fmt_cell(cell: dict) -> str:
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
    if cell.get("rest_ms") is not None:
        text = f"step {comp['step_ms']:.2f} ms = linear {cell['linear_ms']:.2f} + rest {cell['rest_ms']:.2f}"
        parts.append(text)
    parts.append(describe_greedy(cell.get("greedy")))
    return "; ".join(parts)


def print_table(model_name: str, layers: int, rows: list[dict], batches: list[int]) -> None:
    base = rows[0]
    print(f"\n{model_name}-shaped, {layers} decoder layers, random weights; prefill of {base.get('prefill')} tokens;"
          f" decode after a prompt: tok/s and x BF16 per batch (eager, compiled static cache); the compiled step split"
          f" into the linear layers (ms, BF16's / ours), and the rest of the step (ms);"
          f" greedy: rows whose first {COMPARED_TOKENS} tokens compiled == eager")

    def tps(cell, mode):
        return (cell.get(mode) or {}).get("decode_tok_s")

    def ratio(a, b_):
        return f"{a / b_:>5.2f}" if a and b_ else f"{'-':>5}"

    def num(v, width=6, prec=2):
        return f"{v:>{width}.{prec}f}" if isinstance(v, (int, float)) else f"{'-':>{width}}"

    head = f"{'path':<22} {'backend':<10} {'prefill tok/s':>13} {'x':>5}"
    for b in batches:
        head += f" | b{b} eager {'x':>5} compiled {'x':>5} lin ms  x   rest ms  greedy"
    print(head + " | weights GB (linears)  peak GB")
    for r in rows:
        if "error" in r:
            print(f"{r['path']:<22} {r['error']}")
            continue
        line = f"{r['path']:<22} {','.join(r['backends']):<10} {r['prefill_tok_s']:>13.0f} {r['prefill_tok_s'] / base['prefill_tok_s']:>5.2f}"
        for b in batches:
            c, c0 = r["decode"][str(b)], base["decode"][str(b)]
            e, ce = tps(c, "eager"), tps(c, "compiled")
            line += (f" | {e or 0:>8.0f} {ratio(e, tps(c0, 'eager'))} {ce or 0:>8.0f} {ratio(ce, tps(c0, 'compiled'))}"
                     f" {num(c.get('linear_ms'))} {ratio(c0.get('linear_ms'), c.get('linear_ms'))} {num(c.get('rest_ms'), 9)}"
                     f"  {c.get('same_tokens_rows') or '-':>6}")
        print(line + f" | {r['weight_gb']:>6.2f} ({r['linear_weight_gb']:.2f}) {num(r['peak_gb'], 8, 1)}")


def save(results: dict, notes: list[str], args, previous=None):
    """Write the JSON of everything measured so far (replacing the file ``previous`` of an earlier call)."""
    try:
        from benchmarks.common.results import environment, write_json
    except ImportError:  # run as a script: no results writer, print only
        return None
    path = write_json("e2e", environment({"args": vars(args), "notes": notes}),
                      {m: {r["path"]: r.get("decode") for r in v["rows"]} for m, v in results.items()},
                      [dict(model=m, **r) for m, v in results.items() for r in v["rows"]], args.out,
                      "quick" if args.quick else "")
    if previous is not None and previous != path:
        previous.unlink(missing_ok=True)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's full depth)")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--ours", default=None, help="presets run on the default backend (default: every preset)")
    ap.add_argument("--cublaslt", default=None, help="presets also run on cuBLASLt (default: every preset)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-torchao", action="store_true")
    ap.add_argument("--fuse", action="store_true",
                    help="FP8 paths with fused q/k/v and gate/up GEMMs (fp8_linear.fuse_projections): rows '<preset> <backend> fused'")
    ap.add_argument("--no-fuse", action="store_true",
                    help="FP8 paths unfused (the default without --fuse); give both flags for both rows of each path")
    ap.add_argument("--skip-eager", action="store_true", help="leave out the eager decode (its 32 reference tokens still run)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock budget: compiled cells that would not finish in time are skipped (and listed)")
    ap.add_argument("--compile-guess-s", type=float, default=60.0,
                    help="with --budget-s: the compile time assumed before the first one is measured")
    ap.add_argument("--quick", action="store_true", help="a short run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--tiny", action="store_true", help="small models of the same architectures (checks the script)")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only with --tiny, to check the script")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    global DEVICE
    DEVICE = args.device
    if _cuda() and not torch.cuda.is_available():
        raise SystemExit("benchmarks/e2e.py needs a CUDA GPU (or --tiny --device cpu)")
    batches = [int(b) for b in str(args.batches).split(",")]
    presets = [p for p in args.presets.split(",") if p]
    on_cublaslt = presets if args.cublaslt is None else [p for p in args.cublaslt.split(",") if p]
    on_ours = presets if args.ours is None else [p for p in args.ours.split(",") if p]
    fusions = ([False] if args.no_fuse or not args.fuse else []) + ([True] if args.fuse else [])
    notes, results, path = [], {}, None
    clock = Budget(args.budget_s, args.compile_guess_s)
    for name in args.models.split(","):
        model = build_model(name, args.layers, args.tiny)
        layers = model.config.num_hidden_layers
        full = (TINY if args.tiny else MODELS[name])["num_hidden_layers"]
        if layers != full:
            notes.append(f"{name}: {layers} of {full} decoder layers (--layers)")
        bf16 = dict(decoder_linears(model))
        amax = calibrate(model)
        rows = [dict(run_path(model, "bf16", args, batches, clock), prefill=args.prefill)]
        results[name] = dict(layers=layers, rows=rows)
        path = save(results, notes, args, path)
        for preset in presets:
            for backend, fused in [(bk, fu) for bk in ([None] if preset in on_ours else []) + (["cublaslt"] if preset in on_cublaslt else [])
                                   for fu in fusions]:
                label = f"{preset} {'cublaslt' if backend else 'ours'}" + (" fused" if fused else "")
                try:
                    with forced_backend(backend):
                        swap_in(model, fp8_layers(bf16, preset, amax))
                        report = fuse_projections(model) if fused else None
                        row = run_path(model, label, args, batches, clock, held_bytes=weight_bytes(bf16.values()))
                        if report is not None:
                            row["fusion"] = dict(groups=len(report.fused), skipped=[f"{s.parent}: {s.reason}" for s in report.skipped])
                        rows.append(row)
                except Exception as e:  # noqa: BLE001 - e.g. a forced backend that cannot run a preset
                    rows.append(dict(path=label, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
                unfuse_projections(model)  # the parents' hooks go with it
                swap_in(model, bf16)
                reset_compiled(model)
                path = save(results, notes, args, path)
        if not args.no_torchao:
            why = torchao_layers(model)
            if why is None:
                try:
                    rows.append(run_path(model, "torchao float8 rowwise", args, batches, clock, kind="torchao"))
                except Exception as e:  # noqa: BLE001 - reported as the row, the run goes on
                    rows.append(dict(path="torchao float8 rowwise", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"))
            elif f"torchao column skipped: {why}" not in notes:
                notes.append(f"torchao column skipped: {why}")
            path = save(results, notes, args, path)
        print_table(name, layers, rows, batches)
        for r in rows:
            for b, cell in (r.get("decode") or {}).items():
                print(f"  greedy, {r['path']}, batch {b}: {describe_greedy(cell.get('greedy'))}")
        del model, bf16
        reset_compiled(None)
    for n in notes:
        print("note:", n)
    print(f"total {time.perf_counter() - clock.t0:.0f} s")
    path = save(results, notes, args, path)
    if path is not None:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
