"""Experiment: empirical bias correction on top of GPTQ fp8-channel for MiniLM."""
import sys, copy, time, torch
sys.path.insert(0, "benchmarks")
import minilm_fidelity as mf
from fp8_linear import FP8Linear
from fp8_linear.models import load_model
from fp8_linear.calibration.data import materialize_batches
from fp8_linear.calibration.compare import build_eval_batches

def outputs(model, names, batches):
    """mean over non-padding tokens of each named module's output [out] (fp64), and its inputs if asked"""
    sums = {n: 0 for n in names}; cnt = [0]; mask = [None]
    def hook_for(n):
        def hook(_m, args, out):
            y = out.reshape(-1, out.shape[-1])[mask[0]].double()
            sums[n] = sums[n] + y.sum(0)
        return hook
    hs = [model.get_submodule(n).register_forward_hook(hook_for(n)) for n in names]
    with torch.inference_mode():
        for b in batches:
            mask[0] = b.attention_mask.reshape(-1).bool(); cnt[0] += int(mask[0].sum())
            model(input_ids=b.input_ids, attention_mask=b.attention_mask)
    for h in hs: h.remove()
    return {n: s / cnt[0] for n, s in sums.items()}

def local_correct(model, q, batches):
    names = [n for n, m in q.named_modules() if isinstance(m, FP8Linear) and "pooler" not in n]
    xs = mf.layer_inputs(model, names, batches)
    for n in names:
        qm = q.get_submodule(n); lin = model.get_submodule(n)
        x = xs[n]
        with torch.inference_mode():
            ref = (x.double() @ lin.weight.double().t()).mean(0)
            got = (qm(x) - (qm.bias if qm.bias is not None else 0)).double().mean(0)
        qm.bias.data += (ref - got).float()
    return q

def seq_correct(model, q, batches, passes=1):
    names = [n for n, m in q.named_modules() if isinstance(m, FP8Linear) and "pooler" not in n]
    ref = outputs(model, names, batches)
    for n in names:  # one layer at a time, in module order: upstream corrections included
        got = outputs(q, [n], batches)[n]
        q.get_submodule(n).bias.data += (ref[n] - got).float()
    return q

model, tok = load_model("minilm")
calib = mf.sentences("calib")[:1024]
batches = materialize_batches(calib, tok, seq_len=mf.SEQ_LEN, max_samples=len(calib), batch_size=mf.CALIB_BATCH)
eb = build_eval_batches(model, None, tok)
refe = mf.embed(model, eb)
def score(q): c = (mf.embed(q, eb) * refe).sum(-1); return float(c.mean()), float(c.min())
for method in sys.argv[1:] or ["gptq"]:
    base = mf.quantize(method, model, tok, calib, batches)
    print(method, "base", score(base), flush=True)
    t = time.time(); q = local_correct(model, copy.deepcopy(base), batches); print(method, "local", score(q), f"{time.time()-t:.1f}s", flush=True)
    t = time.time(); q = seq_correct(model, copy.deepcopy(base), batches); print(method, "seq", score(q), f"{time.time()-t:.1f}s", flush=True)
