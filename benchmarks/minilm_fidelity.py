"""all-MiniLM-L6-v2 embedding fidelity under FP8 (the bar: mean cosine >= 0.999 with fp8-channel).

    python benchmarks/minilm_fidelity.py [--sentences 1024] [--methods rtn gptq ...] [--out FILE]

Prints one row per method: mean and min cosine between the sentence embeddings of the quantized and
the unquantized (fp32) model on the 64 eval-split sentences the test and ``fp8-linear compare`` use,
and the calibration + quantization time. Embeddings are computed as sentence-transformers computes
all-MiniLM-L6-v2's: attention-masked mean pooling of the last hidden state, then L2 normalization
(cosine does not depend on the normalization; the script checks that too).

Methods (all fp8-channel unless the name says otherwise):

``rtn``            weights rounded to nearest (``gptq=False``).
``gptq``           the library's GPTQ rounding (H from at most ``gptq.MAX_TOKENS`` = 4096 tokens).
``gptq-all``       GPTQ with H from every calibration token.
``gptq-ao``        ``gptq`` with act-order (columns by decreasing ``H[i, i]``; ``gptq.ACT_ORDER``).
``gptq-all-ao``    ``gptq-all`` with act-order.
``gptaq``          GPTQ on the target that accounts for the layer's own activation rounding ``Q``:
                   minimize ``||W X - W_q Q(X)||^2``; ``W' = W (C + l I)(A + l I)^-1`` with
                   ``A = Q(X) Q(X)^T``, ``C = X Q(X)^T`` (the damped least-squares target, shrunk
                   toward ``W``), then GPTQ of ``W'`` with ``H = A``.
``gptaq-seq``      the same with ``Q(X~)`` in place of ``Q(X)``, ``X~`` the inputs the already
                   quantized layers produce (layers in module order; upstream error included).
``dynamic``        fp8-dynamic (per-token activation scales) with GPTQ: is the static scale the limit?
``bias-corr``      ``gptq``, then each layer's bias corrected by the mean output error over the calibration
                   tokens, ``mean(W x) - mean(Q-layer(x))`` on the fp32 model's inputs (empirical bias
                   correction: is the loss a systematic shift that mean pooling keeps?).
``act-align``      ``gptq``, then each static input scale multiplied by the ``g = 2^(i/16)``, i = 0..15,
                   with the least output error ``||(X - Q_g(X)) W_q^T||^2`` on 4096 calibration tokens
                   (the weights' grid alignment, applied to the activations: a feature with near-constant
                   values can be put on a grid point).
``weights-only``   diagnostic, NOT a scheme: the ``gptq`` weights (dequantized) with fp32 activations.
``acts-only``      diagnostic, NOT a scheme: fp32 weights, activations rounded with ``gptq``'s input scales.
``mixed-ffn1``     NOT fp8-channel: fp8-channel + GPTQ with the FFN up projections
                   (``intermediate.dense``, 6 of 37 Linear layers) kept in fp32 (``ignore``).
``mixed-ffn``      NOT fp8-channel: both FFN projections (12 of 37 layers) kept in fp32.

The mixed rows show what a user can get with ``quantize_model(..., ignore=[...])``; they do not count
for the fp8-channel bar.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import pathlib
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository root, for ``benchmarks.common``
    sys.path.insert(0, str(ROOT))

from benchmarks.common.log import Log  # noqa: E402

from fp8_linear import FP8Linear, quantize_model  # noqa: E402
from fp8_linear.calibration import gptq as gptq_mod  # noqa: E402
from fp8_linear.calibration.compare import build_eval_batches  # noqa: E402
from fp8_linear.calibration.data import corpus_text, materialize_batches  # noqa: E402
from fp8_linear.calibration.evaluate import evaluate_models  # noqa: E402
from fp8_linear.calibration.observers import weight_scale  # noqa: E402
from fp8_linear.calibration.quantize import _set_module, calibrate, select_linears  # noqa: E402
from fp8_linear.formats import resolve_format, scale_from_amax  # noqa: E402
from fp8_linear.models import load_model  # noqa: E402
from fp8_linear.quantize import dequantize_fp8, fp8_to_float32, quantize_unchecked  # noqa: E402

#: Issue 3's bar and the calibration sentences' token limit (as the test uses).
BAR = 0.999
SEQ_LEN = 128
CALIB_BATCH = 128
#: Dampening of the GPTAQ least-squares target, as a fraction of mean(diag A).
GPTAQ_DAMP = 0.01
METHODS = ("rtn", "gptq", "gptq-all", "gptq-ao", "gptq-all-ao", "gptaq", "gptaq-seq", "dynamic", "bias-corr", "act-align",
           "weights-only", "acts-only", "mixed-ffn1", "mixed-ffn")
#: act-align: candidate factors per scale, and the calibration tokens that score them.
ALIGN_STEPS = 16
ALIGN_TOKENS = 4096
IGNORE = {"mixed-ffn1": [r"re:.*\.intermediate\.dense$"],
          "mixed-ffn": [r"re:.*\.intermediate\.dense$", r"re:.*layer\.\d+\.output\.dense$"]}


def sentences(split: str) -> list[str]:
    """Lines of the bundled text with >= 4 words (as the test and ``compare`` pick them)."""
    return [s for s in corpus_text(split).split("\n") if len(s.split()) >= 4]


def embed(model: nn.Module, batches) -> torch.Tensor:
    """sentence-transformers embeddings: masked mean pooling + L2 normalization, fp64 ``[sentences, hidden]``."""
    out = []
    with torch.inference_mode():
        for b in batches:
            h = model(input_ids=b.input_ids, attention_mask=b.attention_mask).last_hidden_state.double()
            m = b.attention_mask.unsqueeze(-1).double()
            out.append(F.normalize((h * m).sum(1) / m.sum(1), dim=-1))
    return torch.cat(out)


class _Stop(Exception):
    pass


def layer_inputs(model: nn.Module, names: list[str], batches, stop_after: str | None = None) -> dict[str, torch.Tensor]:
    """Inputs (non-padding tokens, fp32 ``[tokens, in]``) of the named Linear layers over ``batches``;
    with ``stop_after`` each forward stops right after that layer's input is seen."""
    xs = {n: [] for n in names}
    mask = [None]

    def hook_for(name):
        def hook(_m, args):
            x = args[0].reshape(-1, args[0].shape[-1])
            xs[name].append((x[mask[0]] if x.shape[0] == mask[0].numel() else x).float().clone())
            if name == stop_after:
                raise _Stop

        return hook

    handles = [model.get_submodule(n).register_forward_pre_hook(hook_for(n)) for n in names]
    try:
        with torch.inference_mode():
            for b in batches:
                mask[0] = b.attention_mask.reshape(-1).bool()
                try:
                    model(input_ids=b.input_ids, attention_mask=b.attention_mask)
                except _Stop:
                    pass
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(v) for n, v in xs.items()}


def gptaq(model: nn.Module, batches, sequential: bool) -> nn.Module:
    """fp8-channel with the GPTAQ target (see the module docstring); returns a quantized copy."""
    fp8 = resolve_format("e4m3")
    targets = select_linears(model)
    observers = calibrate(model, targets, batches, progress=False)
    names = [n for n in targets if "pooler" not in n]  # the pooler sees one token per sentence: plain rounding
    fp_inputs = layer_inputs(model, names, batches)
    q = copy.deepcopy(model)
    for name, lin in targets.items():
        amax = observers[name].amax("minmax", "e4m3")
        w, scale = lin.weight.detach().float(), None
        if name in fp_inputs:
            x = fp_inputs[name].double()
            xt = layer_inputs(q, [name], batches, stop_after=name)[name] if sequential else fp_inputs[name]
            s = scale_from_amax(torch.tensor([amax]), fp8)
            xq = fp8_to_float32(quantize_unchecked(xt, fp8, s)).double() * float(s)
            a, c = xq.t() @ xq, x.t() @ xq
            eye = torch.eye(a.shape[0], dtype=a.dtype) * (GPTAQ_DAMP * a.diagonal().mean())
            target = torch.linalg.solve(a + eye, (lin.weight.detach().double() @ (c + eye)).t()).t().float()
            scale = weight_scale(target, "channel", "e4m3", "minmax")
            w = gptq_mod.gptq_fp8(target, a, scale)
        src = nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
        src.weight, src.bias = nn.Parameter(w, requires_grad=False), lin.bias
        _set_module(q, name, FP8Linear.from_linear(src, "fp8-channel", input_amax=amax, weight_scale=scale))
    return q


def fp8_layers(q: nn.Module) -> list[str]:
    """Names of ``q``'s FP8Linear layers that see every token (the pooler sees one per sentence)."""
    return [n for n, m in q.named_modules() if isinstance(m, FP8Linear) and "pooler" not in n]


def bias_correct(model: nn.Module, q: nn.Module, batches) -> nn.Module:
    """``q`` with each FP8 layer's bias moved by ``mean(W x) - mean(q_layer(x))`` over the fp32 model's
    inputs ``x`` of that layer (non-padding calibration tokens); in place."""
    names = fp8_layers(q)
    xs = layer_inputs(model, names, batches)
    with torch.inference_mode():
        for n in names:
            qm, w = q.get_submodule(n), model.get_submodule(n).weight.double()
            shift = (xs[n].double() @ w.t()).mean(0) - (qm(xs[n]) - qm.bias).double().mean(0)
            qm.bias.data += shift.float()
    return q


def align_input_scales(model: nn.Module, q: nn.Module, batches) -> nn.Module:
    """``q`` with each static input scale ``s`` replaced by the ``s * 2^(i / ALIGN_STEPS)`` (never
    clips) whose rounding of the layer's fp32 inputs gives the least output error through the
    quantized weights, ``||(X - Q(X)) W_q^T||^2`` on ALIGN_TOKENS tokens; ties keep ``s``; in place."""
    names = fp8_layers(q)
    xs = layer_inputs(model, names, batches)
    gen = torch.Generator().manual_seed(0)
    for n in names:
        qm, x = q.get_submodule(n), xs[n]
        if x.shape[0] > ALIGN_TOKENS:
            x = x[torch.randperm(x.shape[0], generator=gen)[:ALIGN_TOKENS]]
        w = dequantize_fp8(qm.weight, qm.weight_scale)
        s0 = qm.input_scale.detach().clone()
        best_err, best = None, s0
        for i in range(ALIGN_STEPS):
            s = s0 * 2 ** (i / ALIGN_STEPS)
            err = float((((x - dequantize_fp8(quantize_unchecked(x, qm.weight.dtype, s), s)) @ w.t()) ** 2).sum())
            if best_err is None or err < best_err * (1 - 1e-9):
                best_err, best = err, s
        qm.input_scale.data.copy_(best)
    return q


def split_error(model: nn.Module, q: nn.Module, keep: str) -> nn.Module:
    """A copy of the fp32 ``model`` with only one FP8 rounding of ``q`` (``keep`` = ``"weights"``: its
    dequantized weights, fp32 activations; ``"acts"``: fp32 weights, inputs rounded with its input scales)."""
    out = copy.deepcopy(model)
    for name, m in q.named_modules():
        if not isinstance(m, FP8Linear):
            continue
        lin = out.get_submodule(name)
        if keep == "weights":
            lin.weight.data.copy_(dequantize_fp8(m.weight, m.weight_scale))
        else:
            def hook(_m, args, s=m.input_scale, dt=m.weight.dtype):
                return (dequantize_fp8(quantize_unchecked(args[0], dt, s), s),)

            lin.register_forward_pre_hook(hook)
    return out


def quantize(method: str, model, tok, calib: list[str], batches) -> nn.Module:
    if method == "bias-corr":
        return bias_correct(model, quantize("gptq", model, tok, calib, batches), batches)
    if method == "act-align":
        return align_input_scales(model, quantize("gptq", model, tok, calib, batches), batches)
    if method in ("weights-only", "acts-only"):
        return split_error(model, quantize("gptq", model, tok, calib, batches), method.split("-")[0])
    if method.endswith("-ao"):
        gptq_mod.ACT_ORDER = True
        try:
            return quantize(method[:-3], model, tok, calib, batches)
        finally:
            gptq_mod.ACT_ORDER = False
    kw = dict(tokenizer=tok, seq_len=SEQ_LEN, max_samples=len(calib), progress=False)
    if method in ("gptaq", "gptaq-seq"):
        return gptaq(model, batches, sequential=method == "gptaq-seq")
    if method == "gptq-all":
        defaults = gptq_mod.HessianAccumulator.__init__.__defaults__
        gptq_mod.HessianAccumulator.__init__.__defaults__ = (10**9,)
        try:
            return quantize_model(copy.deepcopy(model), calib, "fp8-channel", gptq=True, **kw)
        finally:
            gptq_mod.HessianAccumulator.__init__.__defaults__ = defaults
    scheme = "fp8-dynamic" if method == "dynamic" else "fp8-channel"
    return quantize_model(copy.deepcopy(model), calib, scheme, gptq=method != "rtn", ignore=IGNORE.get(method, ("lm_head",)), **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=1024, help="calibration sentences (default 1024)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--out", default=None, help="also write the printed lines to this file")
    args = ap.parse_args()
    say = Log()
    say(f"# command: python benchmarks/minilm_fidelity.py --sentences {args.sentences} --methods {' '.join(args.methods)}")
    model, tok = load_model("minilm")
    calib = sentences("calib")[: args.sentences]
    batches = materialize_batches(calib, tok, seq_len=SEQ_LEN, max_samples=len(calib), batch_size=CALIB_BATCH)
    eval_batches = build_eval_batches(model, None, tok)  # eval split: disjoint from the calibration text
    ref = embed(model, eval_batches)
    say(f"# {datetime.datetime.now().isoformat(timespec='seconds')}  torch {torch.__version__}, threads "
        f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}")
    say(f"# all-MiniLM-L6-v2, reference: the fp32 model; calibration {len(calib)} sentences "
        f"({sum(b.num_tokens for b in batches)} tokens), eval {ref.shape[0]} sentences; bar {BAR}")
    say(f"{'method':12s} {'cos mean':>9s} {'cos min':>9s} {'time s':>7s}  check")
    for method in args.methods:
        t0 = time.perf_counter()
        q = quantize(method, model, tok, calib, batches)
        dt = time.perf_counter() - t0
        cos = (embed(q, eval_batches) * ref).sum(-1)  # unit vectors: the dot product is the cosine
        # measurement checks: everything but the FP8 tensors is fp32, and the library's metric agrees
        high = {p.dtype for n, p in q.named_parameters() if p.dtype.is_floating_point and p.dtype.itemsize > 1}
        lib = evaluate_models({"ref": model, "q": q}, "ref", eval_batches, progress=False)["q"].embedding_cosine
        n_fp8 = sum(isinstance(m, FP8Linear) for m in q.modules())
        say(f"{method:12s} {float(cos.mean()):9.5f} {float(cos.min()):9.5f} {dt:7.1f}  "
            f"FP8Linear {n_fp8}/37, other params {sorted(str(d).replace('torch.', '') for d in high)}, "
            f"evaluate_models {lib:.5f}")
    if args.out:
        say.write(args.out)


if __name__ == "__main__":
    main()
