"""MoE benchmark: a Qwen3-30B-A3B-shaped model (fewer layers), BF16 against FP8, and the grouped GEMM.

Two parts, one run (docs/moe.md):

1. **Grouped GEMM** on the experts' shapes (128 experts, top-8, hidden 2048, expert intermediate 768:
   ``gate_up [128, 1536, 2048]``, ``down [128, 2048, 768]``), routed token counts drawn from a softmax
   router on random logits, at decode batches and prefill lengths, for each scale layout of ``--scales``:
   ``tensor`` (a static activation scale per expert x a weight scale per expert), ``channel`` (per-token
   x per-channel) and ``block`` (1x128 token groups x 128x128 weight blocks per expert, the DeepSeek-V3 /
   Qwen3-FP8 layout). Candidates: ``ours_sm90`` (our grouped kernel, backend ``sm90_grouped``),
   ``torch_grouped`` (``torch._scaled_grouped_mm``; block: ``torch.nn.functional.scaled_grouped_mm``),
   ``grouped`` (:func:`fp8_linear.grouped_fp8_gemm`, the backend it picks), ``per_expert`` (its per-expert
   fallback, one dense GEMM per expert through the dense dispatcher), ``scaled_mm_loop`` (a loop of
   ``torch._scaled_mm`` per expert with rows on the same FP8 operands and scales, laid out ahead:
   :mod:`benchmarks.moe_loop`, the baseline of the 1.3x bar; block also ``cublaslt_loop``, the package's
   cuBLASLt call per expert) and ``bf16_grouped`` (``torch._grouped_mm`` in BF16, what transformers'
   ``grouped_mm`` experts run). ``triton.testing.do_bench`` medians; a candidate that fails prints its
   error; each row also holds the loop's output against the grouped call's (calc_diff).
2. **Model**: prefill tokens/s (one forward of ``[1, --prefill]``) and decode tokens/s (greedy
   ``generate`` at batch 1, the median token interval with the garbage collector off, the first decode
   step of a call apart), eager, and compiled static cache with
   ``--compile`` (with ``--quick`` or ``--compiled-only``: BF16 and FP8 grouped only; graph breaks and
   CUDA graph skips counted); BF16 (transformers' experts implementation) against
   ``quantize_model(..., fp8-dynamic)`` with the grouped GEMM's own choice and with the per-expert
   fallback forced. ``--profile-prefill`` / ``--profile-decode`` replace the timings by a profile of one
   eager prefill forward / one compiled decode step, BF16 against fp8-dynamic (:mod:`benchmarks.moe_profile`).

Writes a table and ``benchmarks/results/moe-<UTC stamp>[-quick].json`` (with ``--out``, also ``moe-partial.json``
after each model of the model part: a run stopped by a time limit keeps the models it finished). Each compiled
row holds ``build_s`` (the model's construction and quantization), ``first_generate_s`` (compile and CUDA-graph
capture included), ``dynamo_s`` / ``inductor_s`` (compile seconds) and ``elapsed_s``. On a CPU ``--compile``
compiles the decode step too (inductor, no CUDA graphs), so ``--tiny`` checks the compiled path and its compile
time there.

    python -m benchmarks.moe_bench --quick      # < 90 s on an H200 (every scale layout's GEMMs, 2-layer model)
    python -m benchmarks.moe_bench --quick --skip-model --scales tensor,block   # grouped GEMMs against the loop
    python -m benchmarks.moe_bench --quick --compile   # + compiled decode, BF16 against FP8 at batch 1
    python -m benchmarks.moe_bench --quick --compile --compiled-only --skip-gemm --layers 4   # compiled decode only
    python -m benchmarks.moe_bench --layers 8 --compile
    python -m benchmarks.moe_bench --quick --skip-gemm --profile-prefill   # where a 512-token prefill's time goes
    python -m benchmarks.moe_bench --quick --skip-gemm --profile-decode    # a compiled decode step, kernel by kernel
    python -m benchmarks.moe_bench --tiny       # a toy size, to check the script (also on a CPU)
    python -u -m benchmarks.moe_bench --tiny --compile --compiled-only --skip-gemm --layers 48 --prefill 16 --new-tokens 4 --reps 2   # CPU: the full-depth command's path
    python -m benchmarks.moe_bench --quality    # CPU: accuracy of every preset on a tiny Qwen3-MoE vs its dense twin
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from fp8_linear import quantize_fp8
from fp8_linear.grouped_gemm import (
    grouped_backends, grouped_fp8_gemm_unchecked, make_grouped_problem, offsets_from_counts,
    register_grouped_backend, select_grouped_backend, unregister_grouped_backend,
)
from fp8_linear.moe.grouped_backends import PER_EXPERT, SM90_GROUPED, TORCH_GROUPED

from benchmarks.common.cuda_clock import is_cuda
from benchmarks.common.dynamo_counts import compile_seconds
from benchmarks.common.random_model import QUALITY_MOE, from_fields
from benchmarks.moe_loop import ScaledMMLoop
from benchmarks.moe_profile import compile_counters

#: Qwen3-30B-A3B (public config.json values); ``--layers`` cuts the depth.
QWEN3_30B_A3B = dict(
    model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
    num_hidden_layers=48, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
    rms_norm_eps=1e-6, norm_topk_prob=True, decoder_sparse_step=1, tie_word_embeddings=False,
)
#: ``--tiny``: the same architecture at toy size (checks the script; CPU-friendly).
TINY = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, num_experts=16, num_experts_per_tok=4, vocab_size=1024)
DECODE_BATCHES = (1, 8, 32, 128)
PREFILL_TOKENS = (512, 2048, 8192)
QUICK = dict(decode=(1, 32), prefill=(2048,), layers=2, prefill_len=512, new_tokens=32, reps=3)
#: ``--tiny`` token counts (torch's CPU tensorwise ``_scaled_mm`` takes about 0.3 s a call even at 16 rows).
TINY_TOKENS = dict(decode=(1, 8), prefill=(64,))
#: Grouped GEMM scale layouts of part 1 (``--scales``).
SCALES = ("tensor", "channel", "block")


def route(tokens: int, experts: int, k: int, device, seed: int = 0) -> torch.Tensor:
    """Routed rows per expert ``[E]`` (int64) of ``tokens`` tokens: top-``k`` of a softmax of random logits."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g)
    idx = torch.topk(torch.softmax(logits, -1), k, dim=-1).indices
    return torch.bincount(idx.reshape(-1), minlength=experts).to(device)


def _time(fns: dict, device, reps: int) -> dict:
    if is_cuda(device):
        from benchmarks.common.timing import median, time_burst

        return {n: median(t) if not isinstance(t, str) else t for n, t in time_burst(fns, rounds=reps).items()}
    out = {}
    for name, fn in fns.items():
        try:
            fn()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            out[name] = statistics.median(ts)
        except Exception as e:  # noqa: BLE001 - a candidate that cannot run is reported
            out[name] = f"{type(e).__name__}: {e}"[:200]
    return out


def _unavailable(why: str):
    def fn():
        raise RuntimeError(f"unavailable: {why}")
    return fn


def _fmt(v) -> str:
    return f"{v:.4f}ms" if isinstance(v, float) else f"ERR({' '.join(v.split())[:90]})"


def _cublaslt_loop(a, b, sa, sb, ends: list):
    """A loop of the package's cuBLASLt call (fp8_linear.backends.cublaslt, its per-call padding and scale
    layouts), one per expert with rows (``ends``: the offsets on the host); 1x128 x 128x128 blocks."""
    m, n = a.shape[0], b.shape[1]
    starts = [0] + ends[:-1]

    def run():
        from fp8_linear.backends.cublaslt import cublaslt_gemm

        out = torch.empty(m, n, device=a.device, dtype=torch.bfloat16)
        for i, (s, t) in enumerate(zip(starts, ends)):
            if t > s:
                out[s:t] = cublaslt_gemm(a[s:t], b[i], sa[s:t], sb[i], None, torch.bfloat16)
        return out

    return run


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """``1 - 2 sum(xy) / sum(x^2 + y^2)`` in fp64 (docs/design.md section 7)."""
    x, y = x.double(), y.double()
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else 1 - 2 * float((x * y).sum()) / den


def _grouped_fns(problem, a, b, sa, sb, offsets, device) -> dict:
    fns = {}
    for label, backend in (("ours_sm90", SM90_GROUPED), ("torch_grouped", TORCH_GROUPED)):
        ok, why = backend.supports(torch.device(device))
        ok, why = backend.can_run(problem) if ok else (ok, why)
        fns[label] = (lambda backend=backend: backend.run(problem)) if ok else _unavailable(why)
    fns["grouped"] = lambda: grouped_fp8_gemm_unchecked(a, b, sa, sb, offsets)
    fns["per_expert"] = lambda: PER_EXPERT.run(problem)
    return fns


def gemm_candidates(counts: torch.Tensor, n: int, k: int, device, scale: str = "channel") -> tuple[dict, str, ScaledMMLoop]:
    """The candidates of part 1 for one projection ``[E, n, k]`` and routed ``counts``, per-token x
    per-channel scales (``channel``) or a static per-expert activation scale x a per-expert weight scale
    (``tensor``, what fp8-tensor's ``down_proj`` runs: the grouped call takes the expert's scale gathered
    per row ``[M, 1]``, the loop each expert's two scalars). Returns ``(fns, grouped backend, loop)``."""
    e, m = counts.numel(), int(counts.sum())
    w = torch.randn(e, n, k, device=device, dtype=torch.bfloat16) * 0.02
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    offsets = offsets_from_counts(counts)
    ends = offsets.tolist()
    if scale == "tensor":
        qs = [quantize_fp8(w[i], "e4m3", "tensor") for i in range(e)]
        b, sb = torch.stack([q for q, _ in qs]), torch.cat([s.reshape(1) for _, s in qs])
        owner = torch.repeat_interleave(torch.arange(e, device=device), counts.to(device), output_size=m)
        amax = torch.zeros(e, device=device).scatter_reduce_(0, owner, x.float().abs().amax(-1), "amax")
        input_scale = (amax / 448.0).clamp(min=1e-12)  # a calibrated static scale per expert (e4m3 max 448)
        sa = input_scale[owner].unsqueeze(-1)
        a, _ = quantize_fp8(x, "e4m3", "token", scale=sa)
        loop = ScaledMMLoop(a, b, input_scale, sb, ends, "tensor")
    else:
        b, sb = quantize_fp8(w.reshape(e * n, k), "e4m3", "channel")
        b, sb = b.reshape(e, n, k), sb.reshape(e, n, 1)
        a, sa = quantize_fp8(x, "e4m3", "token")
        loop = ScaledMMLoop(a, b, sa, sb, ends, "channel")
    problem = make_grouped_problem(a, b, sa, sb, offsets, check_values=False)
    wt = w.transpose(-2, -1)
    return {
        **_grouped_fns(problem, a, b, sa, sb, offsets, device),
        "scaled_mm_loop": loop,
        "bf16_grouped": lambda: torch._grouped_mm(x, wt, offs=offsets),
    }, select_grouped_backend(problem).name, loop


def block_candidates(counts: torch.Tensor, n: int, k: int, device, scale: str = "block") -> tuple[dict, str, ScaledMMLoop]:
    """Part 1 with block scales (1x128 token groups x 128x128 weight blocks per expert, the DeepSeek-V3 /
    Qwen3-FP8 layout) for one projection ``[E, n, k]``: ``ours_sm90`` (the grouped kernel's block instances;
    tokens quantized by the extension's one-pass 1x128 quantization, M-major scales), ``torch_grouped``
    (``torch.nn.functional.scaled_grouped_mm`` with block-wise recipes, where this torch runs them),
    ``grouped`` (the dispatcher's choice), ``per_expert`` (the generic fallback block experts took before:
    one dense block GEMM per expert through the dense dispatcher, one host sync), ``scaled_mm_loop``
    (cuBLASLt's block-wise ``scaled_mm`` per expert, operands laid out ahead: benchmarks/moe_loop.py) and
    ``cublaslt_loop`` (the package's cuBLASLt call per expert, which pads and relays out per call)."""
    from fp8_linear.moe.sm90_grouped import quantize_groups

    e, m = counts.numel(), int(counts.sum())
    w = torch.randn(e, n, k, device=device, dtype=torch.bfloat16) * 0.02
    qs = [quantize_fp8(w[i], "e4m3", "block") for i in range(e)]
    b, sb = torch.stack([q for q, _ in qs]), torch.stack([s for _, s in qs])
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    a, sa = quantize_groups(x, torch.float8_e4m3fn)
    offsets = offsets_from_counts(counts)
    ends = offsets.tolist()
    problem = make_grouped_problem(a, b, sa, sb, offsets, check_values=False)
    layout = "padded"
    if is_cuda(device):
        from fp8_linear.backends.cublaslt import _block_layout

        ok, why, layout = _block_layout(torch.device(device))
        layout = layout or "padded"
    loop = ScaledMMLoop(a, b, sa, sb, ends, "block", block_layout=layout)

    def torch_grouped():
        from torch.nn.functional import ScalingType, scaled_grouped_mm

        return scaled_grouped_mm(a, b.transpose(-2, -1), sa, ScalingType.BlockWise1x128, sb,
                                 ScalingType.BlockWise128x128, offs=offsets, output_dtype=torch.bfloat16)

    fns = _grouped_fns(problem, a, b, sa, sb, offsets, device)
    fns["torch_grouped"] = torch_grouped
    return {**fns, "scaled_mm_loop": loop, "cublaslt_loop": _cublaslt_loop(a, b, sa, sb, ends)}, \
        select_grouped_backend(problem).name, loop


def gemm_part(cfg: dict, decode: tuple, prefill: tuple, device, reps: int,
              scales: tuple = ("channel", "block")) -> list[dict]:
    """Part 1: every candidate at each scale layout, phase and token count, for ``gate_up`` and ``down``.
    Each row also holds ``loop_vs_grouped_calc_diff``: the loop's output against the grouped call's (the
    same FP8 operands and scales, so it is the two GEMMs' rounding apart, about 1e-6 for bf16 output)."""
    e, k_top, h, i = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    rows = []
    for scale, phase, tokens in [(sc, ph, t) for sc in scales
                                 for ph, tl in (("decode", decode), ("prefill", prefill)) for t in tl]:
        counts = route(tokens, e, k_top, device)
        for proj, n, k in (("gate_up", 2 * i, h), ("down", h, i)):
            make = block_candidates if scale == "block" else gemm_candidates
            fns, chosen, loop = make(counts, n, k, device, scale)
            ms = _time(fns, device, reps)
            row = dict(scales=scale, phase=phase, tokens=tokens, routed=int(counts.sum()),
                       active=int((counts > 0).sum()), proj=proj, n=n, k=k, grouped_backend=chosen, ms=ms,
                       loop_calls=len(loop.calls), loop_mode=loop.mode)
            if isinstance(ms.get("scaled_mm_loop"), float) and isinstance(ms.get("grouped"), float):
                row["loop_vs_grouped_calc_diff"] = calc_diff(loop.result(), fns["grouped"]())
            base = ms.get("scaled_mm_loop")
            if not isinstance(base, float):  # the bare call refused: the package's cuBLASLt loop is the baseline
                base = ms.get("cublaslt_loop")
            for c in ("grouped", "ours_sm90", "torch_grouped"):
                if isinstance(base, float) and isinstance(ms.get(c), float):
                    row[f"{c}_vs_loop"] = base / ms[c]
            if isinstance(ms.get("per_expert"), float) and isinstance(ms.get("ours_sm90"), float):
                row["ours_sm90_vs_per_expert"] = ms["per_expert"] / ms["ours_sm90"]
            rows.append(row)
            ratios = "  ".join(f"{c}/loop={row[f'{c}_vs_loop']:.2f}x" for c in ("ours_sm90", "torch_grouped", "grouped")
                               if f"{c}_vs_loop" in row)
            print(f"{scale:7s} {phase:7s} tokens={tokens:5d} {proj:7s} active={row['active']:3d} "
                  + "  ".join(f"{c}={_fmt(v)}" for c, v in ms.items()) + f"  {ratios} (grouped picks {chosen})")
    return rows


def print_gemm_table(rows: list[dict]) -> None:
    """One line per row: the grouped call, our kernel and the per-expert loop (ms), grouped / loop."""
    print("\ngrouped FP8 GEMM against the per-expert torch._scaled_mm loop (ms; x = loop time / grouped time)")
    print(f"{'scales':7s} {'phase':7s} {'tokens':>6s} {'proj':7s} {'experts':>7s} {'grouped':>9s} {'ours_sm90':>9s} "
          f"{'loop':>9s} {'x':>6s}  {'loop calc_diff':>14s}  backend")
    for r in rows:
        ms = r["ms"]
        loop = ms.get("scaled_mm_loop")
        loop = loop if isinstance(loop, float) else ms.get("cublaslt_loop")
        cell = lambda v: f"{v:9.4f}" if isinstance(v, float) else f"{'ERR':>9s}"  # noqa: E731
        x = r.get("grouped_vs_loop")
        d = r.get("loop_vs_grouped_calc_diff")
        print(f"{r['scales']:7s} {r['phase']:7s} {r['tokens']:6d} {r['proj']:7s} {r['active']:7d} {cell(ms.get('grouped'))} "
              f"{cell(ms.get('ours_sm90'))} {cell(loop)} {f'{x:6.2f}' if x else '     -'}  "
              f"{f'{d:14.2e}' if d is not None else '             -'}  {r['grouped_backend']}")


# ------------------------------------------------------------------------------------------- model
def _wall(fn, device) -> float:
    if is_cuda(device):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if is_cuda(device):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def cpu_compile_config():
    """transformers' ``CompileConfig`` that compiles the static-cache decode step on a CPU too (inductor, default
    mode: no CUDA graphs there); ``generate`` compiles on CUDA only unless told."""
    from transformers.generation.configuration_utils import CompileConfig

    config = CompileConfig(mode="default")
    config._compile_all_devices = True
    return config


def model_times(model, device, prefill: int, new: int, reps: int, compiled: bool) -> dict:
    """Prefill tokens/s (one forward of ``[1, prefill]``, eager) and decode tokens/s at batch 1 (greedy
    ``generate``); compiled: transformers' static-cache compiled decode (``torch.compile`` mode
    reduce-overhead, CUDA graphs), with :func:`compile_counters`.

    The decode step is the median interval between tokens of ``max(1, reps - 1)`` timed ``generate``
    calls (:func:`benchmarks.common.generate_clock.timed_generate`: a streamer stamps every token,
    garbage collection off), after one untimed call (compile, CUDA-graph capture). The first decode step
    of each call, which re-records the CUDA graph for the call's new static cache, is reported apart
    (``first_step_ms``); ``(generate(N) - generate(1)) / (N - 1)`` spread it, and any collection of the
    garbage collector that fell into the longer call, over the steps (docs/moe-investigations.md, "The FP8
    step's extra host time at 2 layers")."""
    import gc

    from torch._dynamo.utils import counters

    from benchmarks.common.generate_clock import timed_generate

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prefill), device=device)
    prompt = torch.randint(0, vocab, (1, 16), device=device)
    kw = dict(cache_implementation="static") if compiled else dict(disable_compile=True)
    if compiled and not is_cuda(device):
        kw["compile_config"] = cpu_compile_config()
    from torch._dynamo.utils import compilation_time_metrics

    compilation_time_metrics.clear()
    counters.clear()
    with torch.inference_mode():
        model(ids)
        gc.collect()
        gc.disable()
        try:
            pre = statistics.median(_wall(lambda: model(ids), device) for _ in range(reps))
        finally:
            gc.enable()
        t0 = time.perf_counter()
        model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kw)
        first_s = time.perf_counter() - t0
        runs = [timed_generate(model, prompt, new, kw)[0] for _ in range(max(1, reps - 1))]
    step = statistics.median(r["step_ms"] for r in runs)
    out = dict(prefill_tok_s=prefill / pre, decode_tok_s=1e3 / step, decode_step_ms=step,
               first_step_ms=statistics.median(r["first_step_ms"] for r in runs),
               mean_step_ms=statistics.median(r["mean_step_ms"] for r in runs), first_generate_s=first_s)
    return {**out, **compile_counters(), **compile_seconds()} if compiled else out


def weight_gb(model) -> float:
    return sum(t.numel() * t.element_size() for t in model.parameters()) / 1e9


#: The models of the model part (``--schemes``): BF16 and the FP8 preset it is compared with.
SCHEMES = ("bf16", "fp8-dynamic")
#: Scheme suffix: the FP8 model's q/k/v projections fused into one GEMM (``fp8_linear.fuse_projections``).
FUSED = "+fused"
#: Every ``--schemes`` name.
SCHEME_CHOICES = SCHEMES + ("fp8-dynamic" + FUSED,)


def each_model(cfg, layers, device, schemes=SCHEMES):
    """Yield ``(scheme, model)`` for each scheme, one model on the device at a time: each is built from the
    same seed (``fp8-*``: then quantized by ``quantize_model`` with the grouped GEMM's experts) and freed
    before the next is built (48 layers are 61 GB in BF16); the caller drops its reference before asking
    for the next."""
    import gc

    from fp8_linear import quantize_model

    for scheme in schemes:
        model = from_fields(cfg, layers, device)
        if scheme != "bf16":
            model = quantize_model(model, None, scheme.removesuffix(FUSED), progress=False, gptq=False)
            if scheme.endswith(FUSED):
                from fp8_linear import fuse_projections

                print(f"{scheme}: {fuse_projections(model)}".splitlines()[0])
        yield scheme, model
        del model
        torch.compiler.reset()
        gc.collect()
        if is_cuda(device):
            torch.cuda.empty_cache()


def model_part(cfg, layers, device, prefill, new, reps, compiled, quick: bool = False,
               compiled_only: bool = False, schemes=SCHEMES, on_rows=None) -> list[dict]:
    """Part 2: BF16 (transformers' experts implementation) against fp8-dynamic (the grouped GEMM's choice,
    and the per-expert fallback forced), eager and (``compiled``) compiled; ``quick`` compiles BF16 and FP8
    grouped only, ``compiled_only`` skips the eager runs. One model on the device at a time: the FP8 model
    is built from the same seed and quantized after the BF16 one is freed (:func:`each_model`). ``on_rows(rows)``
    is called after each model (the rows so far: a run stopped by a time limit keeps them)."""
    rows = []
    modes = [True] if compiled and compiled_only else ([False, True] if compiled else [False])
    variants_of = {"bf16": [("bf16", None)]}
    start = last = time.perf_counter()
    for scheme, model in each_model(cfg, layers, device, schemes):
        build_s = time.perf_counter() - last  # the previous model's release, this one's construction and quantization
        print(f"{scheme}: {layers}-layer model built in {build_s:.1f} s")
        variants = variants_of.get(scheme, [(f"{scheme} grouped", None), (f"{scheme} per_expert", PER_EXPERT)])
        for mode in modes:
            for label, forced in variants:
                if mode and (quick or compiled_only) and forced is not None:
                    continue  # compiled BF16 against compiled FP8 grouped only
                if forced is not None:
                    register_grouped_backend(forced)
                try:
                    t = model_times(model, device, prefill, new, reps, mode)
                except Exception as e:  # noqa: BLE001 - reported, not fatal
                    t = dict(error=f"{type(e).__name__}: {e}"[:300])
                finally:
                    if forced is not None:
                        unregister_grouped_backend(forced.name)
                row = dict(model=label, compiled=mode, layers=layers, weight_gb=weight_gb(model), build_s=build_s,
                           elapsed_s=time.perf_counter() - start, **t)
                rows.append(row)
                diag = (f"  graph breaks {t['graph_breaks']}, graphs {t['graphs']}, cudagraph skips {t['cudagraph_skips']}"
                        f" (first generate {t['first_generate_s']:.1f} s: dynamo {t['dynamo_s']} s, inductor "
                        f"{t['inductor_s']} s; {row['elapsed_s']:.0f} s since start)" if mode and "error" not in t else "")
                print(f"{label:24s} {'compiled' if mode else 'eager   '} " + (
                    f"prefill {t['prefill_tok_s']:9.0f} tok/s  decode {t['decode_tok_s']:7.1f} tok/s "
                    f"(step {t['decode_step_ms']:.3f} ms, first step {t['first_step_ms']:.2f} ms)  weights {row['weight_gb']:.2f} GB" + diag if "error" not in t else t["error"]))
        del model
        if on_rows is not None:
            on_rows(rows)
        last = time.perf_counter()
    return rows


def profile_part(cfg, layers, device, prefill, reps, new, prefill_on: bool, decode_on: bool,
                 schemes=SCHEMES) -> list[dict]:
    """``--profile-prefill``: where one eager prefill forward's time goes, BF16 against fp8-dynamic
    (:mod:`benchmarks.moe_profile`: wall / host time, per-module host time and GPU span, kernels by
    category, the top kernels, host syncs), then the differences; ``--profile-decode``: one compiled
    decode step at batch 1, kernel by kernel (:func:`benchmarks.moe_profile.profile_decode`)."""
    from benchmarks.moe_profile import compare, profile_decode, profile_prefill

    rows, decode = [], []
    for scheme, model in each_model(cfg, layers, device, schemes):
        if prefill_on:
            rows.append(dict(profile_prefill(model, scheme, prefill, reps, device), layers=layers, part="prefill"))
        if decode_on:
            decode.append(dict(profile_decode(model, scheme, new, device), layers=layers, part="decode"))
        del model
    compare(rows)
    if len(decode) == 2:
        b, f = decode
        graph = "cudaGraphLaunch"
        print(f"\ndecode step at batch 1, {layers} layers: {f['model']} {f['step_ms']:.3f} ms against {b['model']} "
              f"{b['step_ms']:.3f} ms ({b['step_ms'] / f['step_ms']:.2f}x; first step {f['first_step_ms']:.2f} against "
              f"{b['first_step_ms']:.2f} ms); GPU busy {f['gpu_busy_ms']:.3f} against {b['gpu_busy_ms']:.3f} ms, kernels "
              f"{f['kernels']:.1f} against {b['kernels']:.1f}, graph launches {f['launch_calls'].get(graph, 0):.1f} against "
              f"{b['launch_calls'].get(graph, 0):.1f} a step")
    return rows + decode


def print_model_table(rows: list[dict]) -> None:
    """Decode at batch 1 per model and mode, with the ratio to BF16 in the same mode."""
    bf = {r["compiled"]: r for r in rows if r["model"] == "bf16" and "error" not in r}
    print("\nmodel decode at batch 1 (x = tokens/s over BF16's in the same mode)")
    print(f"{'model':24s} {'mode':8s} {'layers':>6s} {'decode tok/s':>12s} {'step ms':>8s} {'x':>6s} {'prefill tok/s':>13s}"
          f" {'breaks':>6s} {'cg skips':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:24s} {'compiled' if r['compiled'] else 'eager':8s} {r['layers']:6d} ERR {r['error'][:80]}")
            continue
        base = bf.get(r["compiled"])
        x = f"{r['decode_tok_s'] / base['decode_tok_s']:6.2f}" if base else "     -"
        print(f"{r['model']:24s} {'compiled' if r['compiled'] else 'eager':8s} {r['layers']:6d} {r['decode_tok_s']:12.1f} "
              f"{r['decode_step_ms']:8.3f} {x} {r['prefill_tok_s']:13.0f} {r.get('graph_breaks', '-'):>6} "
              f"{r.get('cudagraph_skips', '-'):>8}")


# ------------------------------------------------------------------------------------------- quality (CPU)
#: ``--quality``: a 2-layer Qwen3-MoE with 8 experts (top-2) at hidden 128, and its dense twin (Qwen3 of the same
#: dims); vocabulary = the 256 byte values, text = ``pydoc_data.topics`` as UTF-8 bytes (calibration / eval splits).
QUALITY_DENSE_DROP = ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob")


def quality_part() -> list[dict]:
    """Top-1 agreement and KL against BF16 of every preset on the MoE model and on its dense twin, weight
    memory, and a calibration of 6 tokens (experts without tokens), on a CPU."""
    from fp8_linear import quantize_model
    from fp8_linear.calibration.data import Batch, corpus_text
    from fp8_linear.calibration.evaluate import evaluate_models
    from fp8_linear.calibration.experts import moe_report

    def text(split, n, seq):
        data = torch.tensor(list(corpus_text(split).encode("utf-8")), dtype=torch.int64)
        return [data[i * seq:(i + 1) * seq] for i in range(n)]

    moe = from_fields(QUALITY_MOE, 2, "cpu").float()
    dense_cfg = {k: v for k, v in QUALITY_MOE.items() if k not in QUALITY_DENSE_DROP}
    dense = from_fields(dict(dense_cfg, model_type="qwen3"), 2, "cpu").float()
    calib = text("calib", 16, 128)
    ev = text("eval", 8, 256)
    batches = [Batch(torch.stack(ev[i:i + 4]), torch.ones(4, 256, dtype=torch.int64)) for i in range(0, 8, 4)]
    rows = []
    for scheme in ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"):
        for label, base, data in (("moe", moe, calib), ("dense", dense, calib), ("moe, 6 calib tokens", moe, [calib[0][:6]])):
            if label.startswith("moe, 6") and scheme not in ("fp8-tensor", "fp8-channel"):
                continue  # dynamic schemes have no activation calibration
            q = quantize_model(copy.deepcopy(base), data, scheme, progress=False)
            r = evaluate_models({"bf16": base, "q": q}, "bf16", batches, progress=False)["q"]
            rep = moe_report(q)
            rows.append(dict(scheme=scheme, model=label, top1=r.top1_agreement, kl=r.kl, tokens=r.tokens,
                             fp8_matrices=rep.fp8_matrices, high_precision=len(rep.high_precision),
                             memory_ratio=rep.weight_memory_ratio,
                             zero_token_experts=sum(t == 0 for x in rep.layers for t in (x.tokens or []))))
            print(f"{scheme:12s} {label:20s} top-1 {r.top1_agreement:.4f}  KL {r.kl:.2e}  FP8 matrices {rep.fp8_matrices}"
                  f"  kept {len(rep.high_precision)}  memory {rep.weight_memory_ratio:.3f}x  "
                  f"experts with 0 tokens {rows[-1]['zero_token_experts']}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run (< 1 minute on an H200; with --compile also compiled BF16 / FP8 decode)")
    ap.add_argument("--tiny", action="store_true", help="a toy-size model (checks the script; runs on a CPU)")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers of the model part (default 4, 2 with --quick; Qwen3-30B-A3B has 48)")
    ap.add_argument("--prefill", type=int, default=None, help="tokens of the prefill forward (default 2048, 512 with --quick / --tiny)")
    ap.add_argument("--new-tokens", type=int, default=None,
                    help="greedy tokens generated for the decode rate (default 64, 32 with --quick / --tiny)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (medians; default 5, 3 with --quick / --tiny)")
    ap.add_argument("--compile", action="store_true", help="also compiled static-cache generate")
    ap.add_argument("--compiled-only", action="store_true", help="with --compile: no eager model runs")
    ap.add_argument("--skip-model", action="store_true", help="grouped GEMM part only")
    ap.add_argument("--skip-gemm", action="store_true", help="model part only")
    ap.add_argument("--schemes", default=",".join(SCHEMES),
                    help="models of the model part, comma-separated, run one after the other (default %(default)s; "
                         "one per call splits a long full-depth run in two; fp8-dynamic+fused: q/k/v fused)")
    ap.add_argument("--profile-prefill", action="store_true",
                    help="instead of the model timings: profile one eager prefill forward of BF16 and fp8-dynamic "
                         "(kernels by category, top kernels, host time and GPU span per module, host syncs)")
    ap.add_argument("--profile-decode", action="store_true",
                    help="instead of the model timings: profile one compiled decode step at batch 1 of BF16 and "
                         "fp8-dynamic, kernel by kernel (with --profile-prefill: both)")
    ap.add_argument("--scales", default=",".join(SCALES),
                    help="grouped GEMM scale layouts, comma-separated: tensor (static per-expert activation x "
                         "per-expert weight scales), channel (per-token x per-channel), block (1x128 x 128x128 blocks)")
    ap.add_argument("--quality", action="store_true",
                    help="only the CPU accuracy table: a tiny Qwen3-MoE and its dense twin, every preset")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.quality:
        rows = quality_part()
        if args.out:
            from benchmarks.common.results import environment, write_json

            print(f"wrote {write_json('moe-quality', environment(), {}, rows, out=args.out)}")
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dict(QWEN3_30B_A3B, **(TINY if args.tiny else {}))
    decode, prefill_list = DECODE_BATCHES, PREFILL_TOKENS
    layers, prefill, new, reps = 4, 2048, 64, 5
    if args.quick or args.tiny:
        decode, prefill_list = (TINY_TOKENS if args.tiny else QUICK)["decode"], (TINY_TOKENS if args.tiny else QUICK)["prefill"]
        layers, prefill, new, reps = QUICK["layers"], QUICK["prefill_len"], QUICK["new_tokens"], QUICK["reps"]
    layers, prefill = args.layers or layers, args.prefill or prefill  # what is given explicitly wins
    new, reps = args.new_tokens or new, args.reps or reps
    print(f"device {device}; grouped backends in order: {[b.name for b in grouped_backends()]}")
    scales = tuple(s for s in args.scales.split(",") if s)
    if not scales or any(s not in SCALES for s in scales):
        ap.error(f"--scales: expected a comma-separated subset of {SCALES}, got {args.scales!r}")
    schemes = tuple(x for x in args.schemes.split(",") if x)
    if not schemes or any(x not in SCHEME_CHOICES for x in schemes):
        ap.error(f"--schemes: expected a comma-separated subset of {SCHEME_CHOICES}, got {args.schemes!r}")
    gemm_rows = [] if args.skip_gemm else gemm_part(cfg, decode, prefill_list, device, reps, scales)
    if gemm_rows:
        print_gemm_table(gemm_rows)
    if args.profile_prefill or args.profile_decode:
        model_rows = [] if args.skip_model else profile_part(cfg, layers, device, prefill, reps, new,
                                                            args.profile_prefill, args.profile_decode, schemes)
        if device == "cuda" or args.out:
            from benchmarks.common.results import environment, write_json

            meta = environment({"model": "Qwen3-30B-A3B-shaped" + (" (tiny)" if args.tiny else ""), "layers": layers})
            print(f"wrote {write_json('moe-profile', meta, {}, gemm_rows + model_rows, out=args.out)}")
        return 0
    def keep_partial(rows):  # overwritten after each model; the stamped result file is written at the end
        if args.out:
            import json
            import pathlib

            pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(args.out) / "moe-partial.json").write_text(json.dumps(rows, indent=1, default=str))

    model_rows = [] if args.skip_model else model_part(cfg, layers, device, prefill, new, reps, args.compile, args.quick,
                                                      args.compiled_only, schemes, keep_partial)
    if model_rows:
        print_model_table(model_rows)
    summary = {}
    for scale in scales if gemm_rows else ():  # per-channel keys unsuffixed; "..._tensor", "..._block" for the others
        tag = "" if scale == "channel" else f"_{scale}"
        rows = [r for r in gemm_rows if r["scales"] == scale]
        for c in ("ours_sm90", "torch_grouped", "grouped"):
            ratios = [r[f"{c}_vs_loop"] for r in rows if f"{c}_vs_loop" in r]
            summary[f"{c}_vs_scaled_mm_loop_min{tag}"] = min(ratios) if ratios else None
            summary[f"{c}_vs_scaled_mm_loop_geomean{tag}"] = statistics.geometric_mean(ratios) if ratios else None
        ratios = [r["ours_sm90_vs_per_expert"] for r in rows if "ours_sm90_vs_per_expert" in r]
        summary[f"ours_sm90_vs_per_expert_min{tag}"] = min(ratios) if ratios else None
    bf = {r["compiled"]: r for r in model_rows if r["model"] == "bf16" and "error" not in r}
    for r in model_rows:
        if r["model"] != "bf16" and "error" not in r and r["compiled"] in bf:
            summary[f"{r['model']}{' compiled' if r['compiled'] else ''} decode vs bf16"] = r["decode_tok_s"] / bf[r["compiled"]]["decode_tok_s"]
            summary[f"{r['model']}{' compiled' if r['compiled'] else ''} prefill vs bf16"] = r["prefill_tok_s"] / bf[r["compiled"]]["prefill_tok_s"]
    print("summary:", {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()})
    if device == "cuda" or args.out:
        from benchmarks.common.results import environment, write_json

        meta = environment({"model": "Qwen3-30B-A3B-shaped" + (" (tiny)" if args.tiny else ""), "layers": layers})
        path = write_json("moe", meta, summary, gemm_rows + model_rows, out=args.out,
                          tag="quick" if args.quick else ("tiny" if args.tiny else ""))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
