"""End-to-end serving benchmark: Llama-3-8B- and Qwen2.5-7B-shaped models, BF16 against each FP8 path.

Models are built from a config with random weights (full depth by default: 32 / 28 decoder layers;
``--layers`` cuts them, and the table says so). Each decoder ``nn.Linear`` becomes
``FP8Linear.from_linear`` (static presets calibrated by one forward pass on random tokens); the
embeddings, norms and ``lm_head`` stay BF16. Paths: ``bf16``; every preset on the default backend
(``ours``: the sm90 kernel where it runs the layer) and on cuBLASLt (``FP8_LINEAR_BACKEND=cublaslt``);
torchao float8 (dynamic per-row activations and weights) when ``torchao`` imports (else a note).

Per path and model:

- prefill tokens/s: one forward of ``[1, --prefill]`` tokens (CUDA events, median of ``--reps``);
- decode tokens/s at each ``--batches`` size: ``generate`` of ``--new-tokens`` greedy tokens after a
  ``--prompt``-token prompt, eager (dynamic cache) and compiled static cache (``cache_implementation=
  "static"``: transformers compiles the decode step, CUDA graphs); decode time = generate(N) -
  generate(1), so TTFT (= generate(1), prefill + first token) is reported apart;
- the compiled decode step split into the decoder's linear layers (GEMM + activation quantization: the
  same layers called in order at M = batch, captured in one CUDA graph) and the rest (attention, norms,
  rotary, sampling, gaps = step - linear);
- weight memory (all parameters, and the decoder linears alone) and peak GPU memory;
- whether the compiled path's first 32 greedy tokens equal eager's, per sequence of the batch (random
  weights give near-flat logits, so BF16's own row says how often the model itself flips).

Writes a table and ``benchmarks/results/e2e-<UTC stamp>[-quick].json``.

    python -m benchmarks.e2e                      # full depth, both models, every path (about 1 h per model)
    python -m benchmarks.e2e --quick              # ~4 minutes on an H200: 2 layers of the 8B shape
    python -m benchmarks.e2e --models llama3-8b --layers 8 --presets fp8-dynamic --batches 1,16

A full-depth run compiles the decode step once per path and batch (about a minute each at 32 layers);
to fit calls of 10 minutes, split it by preset, e.g. ``--models llama3-8b --presets fp8-dynamic
--cublaslt fp8-dynamic`` (BF16 is measured in every call, so each table carries its own baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time

import torch
from torch import nn

from fp8_linear import FP8Linear, settings

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


def weight_bytes(modules) -> int:
    return sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()])


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


#: Greedy tokens compared between the compiled and the eager path.
COMPARED_TOKENS = 32


def prompt_ids(vocab: int, batch: int, prompt: int) -> torch.Tensor:
    """The same random prompt for every path and mode of one batch size."""
    g = torch.Generator().manual_seed(batch * 7919 + prompt)
    return torch.randint(0, vocab, (batch, prompt), generator=g).to(DEVICE)


def generate_times(model, ids: torch.Tensor, new: int, compiled: bool, reps: int) -> dict:
    """TTFT and decode tokens/s of greedy ``generate`` on ``ids`` (eager dynamic cache, or compiled
    static cache), and the first :data:`COMPARED_TOKENS` new tokens (``tokens``, on the CPU)."""
    kw = dict(do_sample=False, cache_implementation="static") if compiled else dict(do_sample=False, disable_compile=True)

    def gen(n):
        return lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)

    with torch.inference_mode():
        first = gen(new)()  # warm-up: compiles and captures the decode step
        ttft = statistics.median(wall_s(gen(1)) for _ in range(reps))
        full = statistics.median(wall_s(gen(new)) for _ in range(max(1, reps - 1)))
    step = (full - ttft) / (new - 1)
    return dict(ttft_ms=ttft * 1e3, step_ms=step * 1e3, decode_tok_s=ids.shape[0] / step,
                tokens=first[:, ids.shape[1]: ids.shape[1] + COMPARED_TOKENS].cpu())


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


def run_path(model, label: str, args, batches: list[int]) -> dict:
    """Every measurement of one path on ``model`` as it is now (its linear layers already swapped in)."""
    lin = list(decoder_linears(model).values())
    backends = sorted({m.backend for m in lin if isinstance(m, FP8Linear)}) or ["bf16"]
    row = dict(path=label, backends=backends, weight_gb=weight_bytes([model]) / 1e9,
               linear_weight_gb=weight_bytes(lin) / 1e9)
    if _cuda():
        torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(0, model.config.vocab_size, (1, args.prefill), device=DEVICE)
    with torch.inference_mode():
        row["prefill_tok_s"] = args.prefill / cuda_ms(lambda: model(ids), args.reps) * 1e3
    row["decode"] = {}
    for b in batches:
        cell = {}
        ids = prompt_ids(model.config.vocab_size, b, args.prompt)
        for mode, compiled in (("eager", False), ("compiled", True)):
            reset_compiled(model)
            try:
                cell[mode] = generate_times(model, ids, args.new_tokens, compiled, args.reps)
            except Exception as e:  # noqa: BLE001 - a path that cannot run is reported, not fatal
                cell[mode] = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        toks = [cell[m].pop("tokens", None) for m in ("eager", "compiled")]
        # rows (sequences of the batch) whose first COMPARED_TOKENS greedy tokens agree, compiled vs eager
        cell["same_tokens_rows"] = (None if any(t is None for t in toks)
                                    else f"{int((toks[0] == toks[1]).all(dim=1).sum())}/{b}")
        lin_ms = linear_step_ms(lin, b)
        step = cell["compiled"].get("step_ms")
        cell["linear_ms"] = lin_ms
        cell["rest_ms"] = None if step is None else step - lin_ms
        row["decode"][str(b)] = cell
        print(f"  {label} batch {b}: {fmt_cell(cell)}", flush=True)
    row["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9 if _cuda() else float("nan")
    reset_compiled(model)
    return row


def torchao_layers(model):
    """Quantize ``model``'s decoder linears with torchao float8 (dynamic per-row), or return the reason it cannot."""
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except Exception as e:  # noqa: BLE001 - torchao absent or too old
        return f"torchao not importable ({type(e).__name__}: {e})"
    quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
              filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
    return None


# ------------------------------------------------------------------------------------------- report
def fmt_cell(cell: dict) -> str:
    parts = []
    for mode in ("eager", "compiled"):
        c = cell.get(mode, {})
        parts.append(f"{mode} {c['decode_tok_s']:.0f} tok/s (TTFT {c['ttft_ms']:.0f} ms)" if "decode_tok_s" in c
                     else f"{mode} {c.get('error', '-')}")
    if cell.get("rest_ms") is not None:
        parts.append(f"step {cell['compiled']['step_ms']:.2f} ms = linear {cell['linear_ms']:.2f} + rest {cell['rest_ms']:.2f}")
    if cell.get("same_tokens_rows") is not None:
        parts.append(f"first {COMPARED_TOKENS} greedy tokens compiled == eager in {cell['same_tokens_rows']} rows")
    return "; ".join(parts)


def print_table(model_name: str, layers: int, rows: list[dict], batches: list[int]) -> None:
    base = rows[0]
    print(f"\n{model_name}-shaped, {layers} decoder layers, random weights; prefill of {rows[0].get('prefill')} tokens;"
          f" decode: tok/s and x BF16 per batch (eager, compiled static cache), the compiled step's linear layers"
          f" (ms, x BF16's) and the rest (ms)")
    head = f"{'path':<22} {'backend':<10} {'prefill tok/s':>13} {'x':>5}"
    for b in batches:
        head += f" | b{b} eager {'x':>5} compiled {'x':>5} lin ms  x   rest ms"
    print(head + " | weights GB (linears)  peak GB")
    for r in rows:
        if "error" in r:
            print(f"{r['path']:<22} {r['error']}")
            continue
        line = f"{r['path']:<22} {','.join(r['backends']):<10} {r['prefill_tok_s']:>13.0f} {r['prefill_tok_s'] / base['prefill_tok_s']:>5.2f}"
        for b in batches:
            c, c0 = r["decode"][str(b)], base["decode"][str(b)]

            def tps(cell, mode):
                return cell.get(mode, {}).get("decode_tok_s")

            def ratio(a, b_):
                return f"{a / b_:>5.2f}" if a and b_ else f"{'-':>5}"

            e, ce = tps(c, "eager"), tps(c, "compiled")
            line += (f" | {e or 0:>8.0f} {ratio(e, tps(c0, 'eager'))} {ce or 0:>8.0f} {ratio(ce, tps(c0, 'compiled'))}"
                     f" {c['linear_ms']:>6.2f} {ratio(c0['linear_ms'], c['linear_ms'])}"
                     f" {c['rest_ms'] if c['rest_ms'] is not None else float('nan'):>6.2f}")
        print(line + f" | {r['weight_gb']:>6.2f} ({r['linear_weight_gb']:.2f}) {r['peak_gb']:>8.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's full depth)")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--cublaslt", default=None, help="presets also run on cuBLASLt (default: every preset)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-torchao", action="store_true")
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
    notes, results = [], {}
    for name in args.models.split(","):
        model = build_model(name, args.layers, args.tiny)
        layers = model.config.num_hidden_layers
        full = (TINY if args.tiny else MODELS[name])["num_hidden_layers"]
        if layers != full:
            notes.append(f"{name}: {layers} of {full} decoder layers (--layers)")
        bf16 = dict(decoder_linears(model))
        amax = calibrate(model)
        rows = [dict(run_path(model, "bf16", args, batches), prefill=args.prefill)]
        for preset in presets:
            for backend in [None] + (["cublaslt"] if preset in on_cublaslt else []):
                label = f"{preset} {'cublaslt' if backend else 'ours'}"
                try:
                    with forced_backend(backend):
                        swap_in(model, fp8_layers(bf16, preset, amax))
                        rows.append(run_path(model, label, args, batches))
                except Exception as e:  # noqa: BLE001 - e.g. a forced backend that cannot run a preset
                    rows.append(dict(path=label, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
                swap_in(model, bf16)
                reset_compiled(model)
        if not args.no_torchao:
            why = torchao_layers(model)
            if why is None:
                rows.append(run_path(model, "torchao float8 rowwise", args, batches))
            elif f"torchao column skipped: {why}" not in notes:
                notes.append(f"torchao column skipped: {why}")
        results[name] = dict(layers=layers, rows=rows)
        print_table(name, layers, rows, batches)
        del model, bf16
        reset_compiled(None)
    for n in notes:
        print("note:", n)
    try:
        from benchmarks.common.results import environment, write_json
    except ImportError:  # run as a script: no results writer, print only
        return 0
    path = write_json("e2e", environment({"args": vars(args), "notes": notes}),
                      {m: {r["path"]: r.get("decode") for r in v["rows"]} for m, v in results.items()},
                      [dict(model=m, **r) for m, v in results.items() for r in v["rows"]], args.out,
                      "quick" if args.quick else "")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
