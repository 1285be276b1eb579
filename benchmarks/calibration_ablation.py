"""Ablations of every calibration step on SmolLM2-135M, on text disjoint from calibration and from the
text the defaults are chosen on.

    python benchmarks/calibration_ablation.py [--windows 16] [--variants all] [--log FILE.jsonl]

Three evaluation texts, none of them seen by the calibration (the embedded corpus' ``calib`` split):

- ``choose``: first half of the embedded eval split; the one text on which defaults are chosen;
- ``report``: second half of the embedded eval split (never used to choose);
- ``stdlib``: docstrings of standard-library modules (:mod:`fp8_linear.calibration.stdlib_text`),
  different authors and subject, never used to choose; its SHA-256 is logged.

Each text gives ``--windows`` windows of 512 tokens, evenly spaced over the text. Every model runs in
bf16 against the unquantized bf16 model. A variant changes one calibration step against a recipe
(``default`` in a name = the recipe before act-order and ``H`` from every token became the package
defaults, i.e. ``H`` from 4096 tokens, natural column order; ``H 16k, act-order`` = the package defaults):
GPTQ on/off, the per-row grid alignment (``fp8_linear/calibration/scale_align.py``) on/off, GPTQ damping, act-order,
the number of tokens in ``H``, calibration windows, the activation observer, and headroom on the static
activation amax. Each variant's result (perplexity, paired per-window NLL, KL, top-1) is appended to
``--log`` as one JSON line as soon as it is measured; ``--table`` prints the Markdown table of a log.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import json
import math
import pathlib
import platform
import re
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fp8_linear.calibration import gptq, scale_align  # noqa: E402
from benchmarks.common.eval_windows import SEQ_LEN, Reference, spread_windows, to_batches  # noqa: E402
from fp8_linear.calibration.data import Batch, corpus_text, materialize_batches  # noqa: E402
from fp8_linear.calibration.quantize import apply_quantization, calibrate, select_linears  # noqa: E402
from fp8_linear.calibration.stdlib_text import stdlib_text, stdlib_text_digest  # noqa: E402
from fp8_linear.models import load_model  # noqa: E402
from fp8_linear.scheme import resolve_scheme  # noqa: E402

TEXTS = ("choose", "report", "stdlib")
#: The package default of 32 calibration windows: the first 28 calibrate, the last 4 are the held-out
#: slice of the mixed-precision budget search (what quantize_model(max_samples=32, max_kl=...) does).
CALIB_WINDOWS, HOLDOUT_WINDOWS = 32, 4
FFN_PATTERN = ".mlp."


class FakeQuantLinear(torch.nn.Module):
    """An FP8Linear's exact FP8 operands, run as a bf16 GEMM (2-3x faster than the emulated backend's
    fp32 GEMM on a CPU): ``weight_deq = q * scale`` and the activations quantized and dequantized as the
    scheme says (static per-tensor ``input_scale``, or dynamic per token / 1x128 group), both rounded to
    bf16 (relative error <= 2^-9 per element, against FP8's 2^-4), with a straight-through gradient."""

    def __init__(self, m):
        from fp8_linear.quantize import expand_scale, fp8_to_float32

        super().__init__()
        self.weight, self.weight_scale, self.input_scale, self.bias = m.weight, m.weight_scale, m.input_scale, m.bias
        self.scheme = m.scheme
        self.granularity = None  # set to "token" to quantize this layer's activations per token at run time
        self.quantize_activations = True  # False: the activations pass unquantized (a diagnostic)
        self.w = (fp8_to_float32(m.weight) * expand_scale(m.weight_scale, m.weight.shape)).to(torch.bfloat16)

    def forward(self, x):
        from fp8_linear.quantize import dequantize_fp8, quantize_fp8

        if not self.quantize_activations:
            return torch.nn.functional.linear(x, self.w.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        x2 = x.reshape(-1, x.shape[-1]).float()
        static = self.granularity is None and self.input_scale is not None
        gran = "tensor" if static else self.granularity or self.scheme.activation_granularity
        q, sc = quantize_fp8(x2.detach(), self.scheme.fmt, gran, scale=self.input_scale if static else None)
        xq = dequantize_fp8(q, sc, torch.float32)
        xq = (x2 + (xq - x2).detach()).to(x.dtype).reshape(x.shape)
        return torch.nn.functional.linear(xq, self.w, None if self.bias is None else self.bias.to(x.dtype))


def fake_quant(model, per_token: str = "", weights_from=None, quantize_activations: bool = True):
    """``model`` with every FP8Linear replaced by its :class:`FakeQuantLinear`, in place; layers whose
    name matches the regex ``per_token`` (``re.search``) quantize their activations per token at run
    time instead of with their static scale (a diagnostic: where the static scale costs accuracy).
    Two more diagnostics split a preset's error into its halves: ``weights_from`` (the unquantized
    model) puts its bf16 weights back in place of the dequantized FP8 ones (activations only), and
    ``quantize_activations=False`` passes the activations unquantized (weights only)."""
    from fp8_linear.module import FP8Linear
    from fp8_linear.calibration.quantize import _set_module

    for name, m in list(model.named_modules()):
        if isinstance(m, FP8Linear):
            f = FakeQuantLinear(m)
            if per_token and re.search(per_token, name):
                f.granularity = "token"
            if weights_from is not None:
                f.w = weights_from.get_submodule(name).weight.detach().to(torch.bfloat16)
            f.quantize_activations = quantize_activations
            _set_module(model, name, f)
    return model


#: The smoothing sites: where an activation's per-channel range can move into the weights that read it
#: with an exact fold on the producer side, as (producer, its consumers) pairs per decoder layer.
#: ``down``: each MLP's ``down_proj`` input (folded into ``up_proj``'s rows; ``act(gate) * up`` is linear
#: in ``up``); ``norm``: the two RMSNorm outputs (folded into the norm's weight), read by q/k/v and gate/up.
SMOOTH_SITES = {
    "down": (("mlp.up_proj", ("mlp.down_proj",)),),
    "norm": (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
             ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"))),
}


def smooth_inputs(model, site: str, alpha: float, batches) -> dict[str, torch.Tensor]:
    """SmoothQuant-style migration of activation ranges into the weights, in place, at ``site`` (a key
    of :data:`SMOOTH_SITES`). Per input channel ``j`` of the consuming Linear layers: ``s_j =
    amax_j(x)^alpha / amax_j(|W[:, j]|)^(1 - alpha)`` (``x`` over ``batches``, ``W`` every consumer's
    weight), divided by its median and floored at 1 (only the outlier channels shrink); the consumers'
    columns ``*= s_j`` and the producer's output channels (``up_proj`` rows, or the norm weight) ``/= s_j``:
    the model's function is unchanged in real arithmetic. Returns ``{first consumer's name: s}``
    (``[in_features]``, fp32 or the weights' fp64)."""
    groups = [(layer.get_submodule(prod), [layer.get_submodule(c) for c in cons], f"model.layers.{i}.{cons[0]}")
              for i, layer in enumerate(model.model.layers) for prod, cons in SMOOTH_SITES[site]]
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    for _, cons, name in groups:
        def hook(mod, inp, name=name):
            a = inp[0].detach().abs().reshape(-1, inp[0].shape[-1]).amax(0)
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        hooks.append(cons[0].register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for b in batches:
                model(input_ids=b.input_ids)
    finally:
        for h in hooks:
            h.remove()
    scales = {}
    with torch.no_grad():
        for prod, cons, name in groups:
            wide = torch.promote_types(cons[0].weight.dtype, torch.float32)  # fp32, or fp64 as given
            wmax = torch.stack([c.weight.to(wide).abs().amax(0) for c in cons]).amax(0)
            s = amax[name].to(wide).clamp_min(1e-8) ** alpha / wmax.clamp_min(1e-8) ** (1 - alpha)
            s = (s / s.median()).clamp_min(1.0)
            for c in cons:
                c.weight.copy_(c.weight.to(wide) * s)
            # the producer's output channels are its weight's first dimension (Linear rows, a norm's vector)
            prod.weight.copy_(prod.weight.to(wide) / s.reshape(-1, *[1] * (prod.weight.dim() - 1)))
            scales[name] = s
    return scales


@dataclasses.dataclass(frozen=True)
class Variant:
    """One calibration recipe. Field defaults = the recipe named ``default`` in the variant names: the
    package defaults before act-order and ``H`` from every token became them (``H 16k, act-order``)."""

    name: str
    scheme: str
    gptq: bool = True
    align: bool = True              # per-row grid alignment (GPTQ recipes with per-channel scales)
    align_rtn: bool = False         # the alignment without GPTQ (rounded to nearest on the aligned grid)
    damp: float = 0.01
    act_order: bool = False
    h_tokens: int = 4096            # tokens folded into each H (gptq.MAX_TOKENS)
    act_observer: str = "minmax"
    act_headroom: float = 1.0       # static activation amax multiplied by this
    weight_observer: str = "minmax"
    smooth: tuple[str, float] | None = None  # (site, alpha) of smooth_inputs before calibration
    per_token: str = ""             # regex of layers whose activations are quantized per token (fake_quant)
    quant_weights: bool = True      # False: the bf16 weights, only the activations quantized (a diagnostic)
    quant_activations: bool = True  # False: the activations unquantized, only the weights (a diagnostic)


def variants() -> list[Variant]:
    """The ablation grid, most informative first: each changes one step of the defaults, or one step
    on top of more tokens in ``H`` (16k: every calibration token)."""
    c, t, d = "fp8-channel", "fp8-tensor", "fp8-dynamic"
    letter = {c: "C", t: "T", d: "D"}
    return [
        Variant("T default", t), Variant("C default", c),
        Variant("C H 16k tokens", c, h_tokens=16384), Variant("T H 16k tokens", t, h_tokens=16384),
        Variant("C H 16k, no align", c, align=False, h_tokens=16384),
        Variant("C GPTQ, no align", c, align=False),
        Variant("T RTN (no GPTQ)", t, gptq=False), Variant("C RTN (no GPTQ)", c, gptq=False),
        Variant("D default", d), Variant("D H 16k tokens", d, h_tokens=16384),
        Variant("C RTN + align", c, gptq=False, align_rtn=True),
        Variant("C H 16k, act-order", c, h_tokens=16384, act_order=True),
        Variant("T H 16k, act-order", t, h_tokens=16384, act_order=True),
        Variant("C H 16k, damp 0.1", c, h_tokens=16384, damp=0.1),
        Variant("C H 16k, act amax x2", c, h_tokens=16384, act_headroom=2.0),
        Variant("T H 16k, act amax x2", t, h_tokens=16384, act_headroom=2.0),
        Variant("D RTN (no GPTQ)", d, gptq=False), Variant("D H 16k, no align", d, align=False, h_tokens=16384),
        Variant("T H 16k, damp 0.1", t, h_tokens=16384, damp=0.1),
        Variant("C H 16k, no align, act-order", c, align=False, h_tokens=16384, act_order=True),
        # on top of the package defaults (H from every token, act-order): fp8-dynamic's column order,
        # then the observers (the static activation scale; per-channel weight ranges)
        Variant("D H 16k, act-order", d, h_tokens=16384, act_order=True),
        Variant("C H 16k, act-order, act mse", c, h_tokens=16384, act_order=True, act_observer="mse"),
        Variant("T H 16k, act-order, act mse", t, h_tokens=16384, act_order=True, act_observer="mse"),
        Variant("C H 16k, act-order, act percentile", c, h_tokens=16384, act_order=True, act_observer="percentile"),
        Variant("T H 16k, act-order, act percentile", t, h_tokens=16384, act_order=True, act_observer="percentile"),
        Variant("C H 16k, act-order, weight mse", c, h_tokens=16384, act_order=True, weight_observer="mse"),
        # where the static activation scale costs accuracy: on top of the defaults, one layer kind's
        # activations per token (a diagnostic, not a preset), and the down_proj outliers moved into its weight
        *(Variant(f"C H 16k, act-order, per-token {k}", c, h_tokens=16384, act_order=True, per_token=rx)
          for k, rx in (("q/k/v", r"\.(q|k|v)_proj$"), ("o", r"\.o_proj$"), ("gate/up", r"\.(gate|up)_proj$"),
                        ("down", r"\.down_proj$"))),
        *(Variant(f"{letter[p]} H 16k, act-order, smooth {site} {alpha}", p, h_tokens=16384, act_order=True,
                  smooth=(site, alpha))
          for site, alpha, presets in (("down", 0.5, (c, t, d)), ("norm", 0.5, (c, t, d)), ("norm", 0.8, (c, t)))
          for p in presets),
        # each preset's error split in two on top of the defaults: the activations alone (bf16 weights),
        # the weights alone (bf16 activations); T and C share their static activation scales
        *(Variant(f"{letter[p]} H 16k, act-order, activations only", p, h_tokens=16384, act_order=True,
                  quant_weights=False) for p in (c, d)),
        *(Variant(f"{letter[p]} H 16k, act-order, weights only", p, h_tokens=16384, act_order=True,
                  quant_activations=False) for p in (c, t, d)),
    ]



def calibration_split(tok) -> tuple[list[Batch], list[Batch]]:
    """The package default's calibration windows of ``calib`` in batches of 4: (the calibrating ones,
    the held-out slice of the mixed-precision search)."""
    batches = materialize_batches(None, tok, seq_len=SEQ_LEN, max_samples=CALIB_WINDOWS, batch_size=4)
    return batches[:-HOLDOUT_WINDOWS // 4], batches[-HOLDOUT_WINDOWS // 4:]


def eval_texts(tok, windows: int, names: tuple[str, ...] = TEXTS) -> dict[str, list[Batch]]:
    """``windows`` windows of 512 tokens of each text in ``names`` (of :data:`TEXTS`)."""
    read = {"choose": lambda: corpus_text("choose"), "report": lambda: corpus_text("report"), "stdlib": stdlib_text}
    unknown = set(names) - set(read)
    if unknown or not names:
        raise ValueError(f"texts: expected a non-empty subset of {', '.join(TEXTS)}, got {', '.join(names) or 'none'}")
    return {k: to_batches(spread_windows(read[k](), tok, windows)) for k in TEXTS if k in names}


def calibrate_with_snapshots(model, targets, batches, h_tokens: list[int], histogram: bool = False) -> dict:
    """One calibration over ``batches``; each observer keeps ``hessians[n]`` = a copy of its ``H``
    after the first ``n`` tokens for every ``n`` in ``h_tokens`` (so one pass serves every H size).
    ``histogram``: also keep the ``|x|`` histograms (the ``percentile`` and ``mse`` activation observers)."""
    orig = gptq.HessianAccumulator.update

    def update(self, x):
        orig(self, x)
        snaps = self.__dict__.setdefault("snaps", {})
        for n in h_tokens:
            if n not in snaps and (self.tokens >= n or self.tokens >= self.max_tokens):
                snaps[n] = (self.h if n == self.max_tokens else self.h.clone(), self.tokens)

    gptq.HessianAccumulator.update = update
    try:
        obs = calibrate(model, targets, batches, progress=False, histogram=histogram, hessian=True, hessian_tokens=max(h_tokens))
    finally:
        gptq.HessianAccumulator.update = orig
    for o in obs.values():
        h = o.hessian
        for n in h_tokens:
            if n not in h.__dict__.get("snaps", {}):
                h.__dict__.setdefault("snaps", {})[n] = (h.h, h.tokens)
    return obs


def with_hessian(observers: dict, n: int) -> dict:
    """Copies of the observers whose ``H`` is the snapshot after ``n`` tokens (shared H stay shared)."""
    made: dict[int, gptq.HessianAccumulator] = {}
    out = {}
    for name, o in observers.items():
        c = copy.copy(o)
        if id(o.hessian) not in made:
            h, tokens = o.hessian.snaps[n]
            acc = gptq.HessianAccumulator(h.shape[0], n)
            acc.h, acc.tokens = h, tokens
            made[id(o.hessian)] = acc
        c.hessian = made[id(o.hessian)]
        out[name] = c
    return out


def build(model, v: Variant, observers):
    """A quantized bf16 copy of ``model`` with recipe ``v`` (module constants set for the call)."""
    old = (gptq.DAMP, gptq.ACT_ORDER, scale_align.ALIGN_CANDIDATES)
    gptq.DAMP, gptq.ACT_ORDER = v.damp, v.act_order
    scale_align.ALIGN_CANDIDATES = scale_align.ALIGN_CANDIDATES if v.align else 1
    try:
        q = copy.deepcopy(model)
        scheme = resolve_scheme(v.scheme).with_(activation_observer=v.act_observer, weight_observer=v.weight_observer)
        obs = observers
        if v.act_headroom != 1.0:
            obs = {n: copy.copy(o) for n, o in observers.items()}
            for o in obs.values():
                o.max *= v.act_headroom
        targets = select_linears(q)
        if v.align_rtn:  # alignment alone: the aligned per-channel scales, rounded to nearest
            from fp8_linear.calibration.quantize import _align_scales, _weight_key, prepare_weights
            key = _weight_key(scheme, False)
            scales = {key: prepare_weights(targets, [scheme], obs, False)[key][0]}
            _align_scales(targets, {key: scheme}, scales, obs)
            cache = {key: (scales[key], {})}
            with torch.no_grad():
                return apply_quantization(q, targets, scheme, obs, gptq=False, cache=cache)
        with torch.no_grad():
            # activations-only variants put the bf16 weights back (fake_quant), so no GPTQ for them
            return apply_quantization(q, targets, scheme, obs, gptq=v.gptq and v.quant_weights)
    finally:
        gptq.DAMP, gptq.ACT_ORDER, scale_align.ALIGN_CANDIDATES = old



def run(args) -> None:
    t_start = time.time()
    model, tok = load_model(None)
    model = model.to(torch.bfloat16).eval()
    texts = eval_texts(tok, args.windows, tuple(args.texts.split(",")))
    wanted = variants() if args.variants == "all" else [v for v in variants() if v.name in args.variants.split(";")]
    done = set()
    log = pathlib.Path(args.log)
    if log.exists():
        done = {json.loads(line)["variant"] for line in log.read_text().splitlines() if line.strip()}
    wanted = [v for v in wanted if v.name not in done]
    header = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": platform.processor() or platform.machine(),
              "python": platform.python_version(), "torch": torch.__version__, "stdlib_sha256": stdlib_text_digest(),
              "windows_per_text": args.windows, "seq_len": SEQ_LEN, "dtype": "bfloat16"}
    print(json.dumps(header), flush=True)
    targets = select_linears(model)
    t0 = time.time()
    ref = {k: Reference(model, b) for k, b in texts.items()}
    print(f"reference evaluated in {time.time() - t0:.0f} s", flush=True)
    t0 = time.time()
    cal, hold = calibration_split(tok)
    h_sizes = sorted({v.h_tokens for v in wanted})
    histogram = any(v.act_observer != "minmax" for v in wanted)
    bases = {None: (model, calibrate_with_snapshots(model, targets, cal, h_sizes, histogram=histogram))}
    for sm_key in {v.smooth for v in wanted} - {None}:  # a smoothed model calibrates anew
        sm = copy.deepcopy(model)
        smooth_inputs(sm, *sm_key, cal)
        bases[sm_key] = (sm, calibrate_with_snapshots(sm, select_linears(sm), cal, h_sizes, histogram=histogram))
    print(f"calibrated in {time.time() - t0:.0f} s", flush=True)
    for v in wanted:
        t0 = time.time()
        base, observers = bases[v.smooth]
        q = fake_quant(build(base, v, with_hessian(observers, v.h_tokens)), v.per_token,
                       weights_from=None if v.quant_weights else base, quantize_activations=v.quant_activations)
        t_build = time.time() - t0
        rec = {"variant": v.name, **dataclasses.asdict(v), **header, "build_s": round(t_build, 1)}
        for text, batches in texts.items():
            rec[text] = ref[text].compare(q)
        rec["eval_s"] = round(time.time() - t0 - t_build, 1)
        with log.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"{v.name:40s} " + "  ".join(f"{t} {rec[t]['ppl_delta_pct']:+.3f}+-{rec[t]['ppl_delta_se_pct']:.3f}"
                                          for t in texts) + f"  ({t_build:.0f}+{rec['eval_s']:.0f} s)", flush=True)
        if v.name == "C default" and args.mixed:
            mixed_precision_run(model, q, targets, cal, hold, ref, log, header)
        del q
        gc.collect()
    print(f"total {time.time() - t_start:.0f} s", flush=True)


def mixed_precision_run(model, q, targets, cal, hold, ref, log, header) -> None:
    """The budget search (:func:`~fp8_linear.calibration.mixed_precision.keep_to_budget`) on the
    fp8-channel model ``q``: budget = the held-out-slice KL of the same model with every FFN projection
    back in BF16; both measured on the eval texts. Leaves ``q`` as it was."""
    from fp8_linear.calibration import mixed_precision as mp
    from fp8_linear.calibration.quantize import _set_module

    t0 = time.time()
    originals = dict(targets)
    quantized = {n: q.get_submodule(n) for n in originals}
    refs = mp.reference_logprobs(model, hold)
    rank = mp.split_ranking(cal, hold)
    rank_refs = mp.reference_logprobs(model, rank)
    ffn = [n for n in originals if FFN_PATTERN in n]
    for n in ffn:
        _set_module(q, n, originals[n])
    budget = mp.measure_kl(q, hold, refs)
    rec = {"variant": "mixed precision (C default)", **header, "budget_kl_holdout": budget,
           "ffn_bf16_layers": len(ffn), "holdout_tokens": mp._tokens(hold)}
    for text in ref:
        rec[f"ffn-bf16 {text}"] = ref[text].compare(q)
    for n in ffn:
        _set_module(q, n, quantized[n])
    rep = mp.keep_to_budget(q, quantized, originals, hold, refs, budget, _set_module, rank, rank_refs)
    rec.update(kept=rep.kept, kl_holdout=rep.kl, kl_se_holdout=rep.kl_se, margin_se=rep.margin_se,
               kl_all_fp8_holdout=rep.kl_all_fp8, weight_bytes=rep.weight_bytes,
               weight_bytes_all_fp8=rep.weight_bytes_all_fp8, weight_bytes_unquantized=rep.weight_bytes_unquantized,
               ffn_bf16_weight_bytes=rep.weight_bytes_all_fp8 - sum(quantized[n].weight.numel() + 4 * quantized[n].weight_scale.numel() for n in ffn)
               + sum(originals[n].weight.numel() * 2 for n in ffn))
    for text in ref:
        rec[f"budget {text}"] = ref[text].compare(q)
    for n in rep.kept:
        _set_module(q, n, quantized[n])
    rec["s"] = round(time.time() - t0, 1)
    with log.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    print(rep.summary(), flush=True)
    print("mixed: " + "  ".join(f"{t}: ffn-bf16 KL {rec['ffn-bf16 ' + t]['kl']:.5f} budget KL {rec['budget ' + t]['kl']:.5f}"
                                for t in ref) + f" (budget {budget:.5f}; {len(rep.kept)} vs {len(ffn)} BF16 layers)", flush=True)


def activation_sites(windows: int) -> str:
    """Where the static per-tensor activation scale loses to per-token scales, per layer kind: the bf16
    model calibrated as the presets are (minmax over the calibration windows), then on ``windows`` windows
    of ``stdlib`` each Linear input ``x`` quantized both ways (e4m3). Columns: share of nonzero elements
    below the smallest normal (2^-6 in FP8 units) and above 448 under the static scale, the geometric
    mean of each token's largest ``|x| / scale``, the SQNR of both ways over all elements and without
    each token's largest element, and that element's share of the input power. Returns a Markdown table."""
    from fp8_linear.formats import fmt_max, scale_from_amax
    from fp8_linear.quantize import dequantize_fp8, quantize_fp8

    fmt = torch.float8_e4m3fn
    top_code, smallest_normal = fmt_max(fmt), torch.finfo(fmt).smallest_normal
    model, tok = load_model(None)
    model = model.to(torch.bfloat16).eval()
    targets = select_linears(model)
    obs = calibrate(model, targets, calibration_split(tok)[0], progress=False, histogram=False)
    keys = ("elems", "sub", "clip", "tok", "log2_tokmax", "pow", "pow_top", "e_static", "e_token", "e_static_rest", "e_token_rest")
    stats: dict[str, dict[str, float]] = {}
    hooks = []
    for name, m in targets.items():
        scale = scale_from_amax(torch.as_tensor(obs[name].max), fmt)

        def hook(mod, inp, kind=name.rsplit(".", 1)[1], scale=scale):
            x = inp[0].detach().float().reshape(-1, inp[0].shape[-1])
            st = stats.setdefault(kind, dict.fromkeys(keys, 0.0))
            u = (x / scale).abs()
            top = torch.zeros_like(x, dtype=torch.bool).scatter_(1, x.abs().argmax(1, keepdim=True), True)
            ds = dequantize_fp8(*quantize_fp8(x, fmt, "tensor", scale=scale), torch.float32) - x
            dt = dequantize_fp8(*quantize_fp8(x, fmt, "token"), torch.float32) - x
            for k, v in (("elems", u.numel()), ("sub", ((u < smallest_normal) & (u > 0)).sum()), ("clip", (u > top_code).sum()),
                         ("tok", u.shape[0]), ("log2_tokmax", torch.log2(u.amax(1).clamp_min(1e-30)).sum()),
                         ("pow", x.pow(2).sum()), ("pow_top", x[top].pow(2).sum()),
                         ("e_static", ds.pow(2).sum()), ("e_token", dt.pow(2).sum()),
                         ("e_static_rest", ds[~top].pow(2).sum()), ("e_token_rest", dt[~top].pow(2).sum())):
                st[k] += float(v)
        hooks.append(m.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for b in to_batches(spread_windows(stdlib_text(), tok, windows)):
                model(input_ids=b.input_ids)
    finally:
        for h in hooks:
            h.remove()
    db = lambda p, e: 10 * math.log10(p / e)  # noqa: E731
    lines = ["| layer | subnormal % | clipped % | token max (FP8 units, geo. mean) | SQNR static / per-token dB "
             "| without each token's largest element | largest element's share of power |", "|---|---|---|---|---|---|---|"]
    for kind, st in stats.items():
        rest = st["pow"] - st["pow_top"]
        lines.append(f"| {kind} | {100 * st['sub'] / st['elems']:.3f} | {100 * st['clip'] / st['elems']:.5f} | "
                     f"{2 ** (st['log2_tokmax'] / st['tok']):.0f} | {db(st['pow'], st['e_static']):.2f} / "
                     f"{db(st['pow'], st['e_token']):.2f} | {db(rest, st['e_static_rest']):.2f} / "
                     f"{db(rest, st['e_token_rest']):.2f} | {100 * st['pow_top'] / st['pow']:.1f}% |")
    return "\n".join(lines)


def paired_se_pct(a: list[float], b: list[float], base: list[float]) -> tuple[float, float]:
    """(difference in ppl-vs-base points between a and b, its paired standard error), from per-window NLLs."""
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
    nb = sum(base) / len(base)
    ra, rb = math.exp(sum(a) / len(a) - nb), math.exp(sum(b) / len(b) - nb)
    return 100 * (ra - rb), 100 * rb * math.exp(mean) * se


def table(log: str) -> str:
    recs = [json.loads(line) for line in pathlib.Path(log).read_text().splitlines() if line.strip()]
    mixed = [r for r in recs if "budget_kl_holdout" in r]
    recs = [r for r in recs if any(t in r for t in TEXTS)]
    texts = [t for t in TEXTS if recs and all(t in r for r in recs)]  # the texts every variant was evaluated on
    lines = ["| variant | " + " | ".join(f"{t} ppl % (+-SE) | {t} KL" for t in texts) + " |",
             "|---|" + "---|---|" * len(texts)]
    for r in recs:
        lines.append(f"| {r['variant']} | " + " | ".join(
            f"{r[t]['ppl_delta_pct']:+.2f} ({r[t]['ppl_delta_se_pct']:.2f}) | {r[t]['kl']:.4f}" for t in texts) + " |")
    by = {r["variant"]: r for r in recs}
    pairs = [(c, t) for c, t in (("C default", "T default"), ("C H 16k tokens", "T H 16k tokens"),
                                 ("C 128 windows, H 64k", "T 128 windows, H 64k"),
                                 ("C 128 windows, H 64k, no align", "T 128 windows, H 64k"),
                                 ("C RTN (no GPTQ)", "T RTN (no GPTQ)"), ("C GPTQ, no align", "T default"),
                                 ("C RTN + align", "T RTN (no GPTQ)")) if c in by and t in by]
    def paired(title: str, rows: list[tuple[str, str, str]], with_kl: bool) -> list[str]:
        """A Markdown table of (label, row a, row b): a minus b per text, paired over the windows."""
        out = ["", f"| {title} | " + " | ".join(texts) + " |", "|---|" + "---|" * len(texts)]
        for label, a, b in rows:
            cells = []
            for x in texts:
                ra, rb = by[a][x], by[b][x]
                d, se = paired_se_pct(ra["window_nll"], rb["window_nll"], rb["base_window_nll"])
                extra = f" / {100 * (ra['kl'] / rb['kl'] - 1):+.0f}% / {100 * (ra['top1'] - rb['top1']):+.1f}" if with_kl else ""
                cells.append(f"{d:+.2f} ({se:.2f}){extra}")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        return out

    if pairs:
        lines += paired("fp8-channel minus fp8-tensor (ppl points, paired SE)", [(f"{c} - {t}", c, t) for c, t in pairs], False)
    steps = []
    for r in recs:  # a row named "<other row>, <step>" is paired against that row
        base = max((n for n in by if r["variant"].startswith(n + ", ")), key=len, default=None)
        if base is not None:
            steps.append((f"{r['variant'][len(base) + 2:]} (on {base})", r["variant"], base))
    if steps:
        lines += paired("step (paired: ppl points (SE) / KL change / top-1 points)", steps, True)
    for m in mixed:
        lines += ["", f"Mixed precision (fp8-channel defaults), budget = held-out-slice KL of FFN-in-BF16: "
                      f"{m['budget_kl_holdout']:.5f} nats/token ({m['holdout_tokens']} tokens); budget search: "
                      f"{m['kl_holdout']:.5f} with {len(m['kept'])} BF16 layers (FFN-in-BF16: {m['ffn_bf16_layers']}).", "",
                  "| model | BF16 layers | weight MiB | " + " | ".join(f"{t} KL | {t} ppl % (+-SE)" for t in TEXTS) + " |",
                  "|---|---|---|" + "---|---|" * len(TEXTS)]
        for k, n, b in (("ffn-bf16", m["ffn_bf16_layers"], m["ffn_bf16_weight_bytes"]), ("budget", len(m["kept"]), m["weight_bytes"])):
            lines.append(f"| {k} | {n} | {b / 2**20:.1f} | " + " | ".join(
                f"{m[k + ' ' + t]['kl']:.5f} | {m[k + ' ' + t]['ppl_delta_pct']:+.2f} ({m[k + ' ' + t]['ppl_delta_se_pct']:.2f})"
                for t in TEXTS) + " |")
        lines.append(f"\nKept in BF16 by the budget search: {', '.join(m['kept'])}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=4, help="eval windows of 512 tokens per text")
    ap.add_argument("--texts", default=",".join(TEXTS),
                    help="eval texts, comma-separated (default all: choose,report,stdlib; 'stdlib' alone holds 64 windows)")
    ap.add_argument("--mixed", action=argparse.BooleanOptionalAction, default=True,
                    help="after 'C default', run the mixed-precision budget search against FFN-in-BF16")
    ap.add_argument("--variants", default="all", help="'all' or variant names separated by ';'")
    ap.add_argument("--log", default="benchmarks/results/calibration_ablation_smollm2_cpu_20261201.jsonl")
    ap.add_argument("--table", action="store_true", help="print the Markdown table of --log and exit")
    ap.add_argument("--list", action="store_true", help="list the variants and exit")
    ap.add_argument("--activation-sites", action="store_true",
                    help="print where the static activation scale loses to per-token scales (--windows of stdlib) and exit")
    args = ap.parse_args()
    if args.list:
        print("\n".join(v.name for v in variants()))
        return 0
    if args.table:
        print(table(args.log))
        return 0
    if args.activation_sites:
        print(activation_sites(args.windows))
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
