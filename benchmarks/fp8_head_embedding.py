"""FP8 ``lm_head`` and FP8 input embedding: weight memory of 8B-class shapes, and accuracy on SmolLM2.

    python -m benchmarks.fp8_head_embedding                 # both parts (about 6 minutes on a 2-core CPU)
    python -m benchmarks.fp8_head_embedding --memory-only   # the memory table alone (seconds)

1. Weight memory, from shapes: each model of ``benchmarks.common.random_model.MODELS`` (Llama-3-8B,
   Qwen2.5-7B, full depth) is built on the meta device; every decoder ``nn.Linear`` is replaced by a
   meta ``FP8Linear`` of ``--scheme``, ``lm_head`` by one too (``+head``) and the input embedding by a
   meta ``FP8Embedding`` (``+emb``); bytes are ``numel * element_size`` of every parameter and buffer
   (``benchmarks.common.weight_memory``), FP8 scales included. Printed as GB and as a fraction of BF16.
2. Accuracy: the bundled SmolLM2-135M (tied embeddings, so the head and the embedding are quantized
   together, one shared table) in ``--dtype``, quantized by ``quantize_model`` with the package
   defaults (GPTQ, the embedded calibration split) with and without ``quantize_lm_head=True,
   quantize_embeddings=True``; evaluated by ``calibration.evaluate.evaluate_models`` against the
   unquantized model in the same dtype on ``--windows`` windows of 512 tokens of the embedded eval split
   (``pydoc_data.topics``, disjoint from calibration): KL per token, top-1 agreement, perplexity.
   ``--split`` measures instead the head alone and the embedding alone, each on a copy whose ``lm_head`` has its own
   copy of the table (untied: the head then goes through GPTQ and the preset's weight observer).

Writes JSON to ``--out`` (default ``benchmarks/results/fp8_head_embedding_<UTC date>.json``).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import pathlib
import time

import torch
from torch import nn

from benchmarks.common.random_model import MODELS
from benchmarks.common.weight_memory import weight_bytes
from fp8_linear import FP8Embedding, FP8Linear, quantize_model
from fp8_linear.calibration.evaluate import eval_batches, evaluate_models
from fp8_linear.embedding import tie_to_head

VARIANTS = (("bf16", False, False, False), ("fp8", True, False, False), ("fp8 +head", True, True, False),
            ("fp8 +head +emb", True, True, True))


def meta_model(name: str):
    """The BF16 ``*ForCausalLM`` of shape ``name`` (full depth) on the meta device: shapes, no data."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(MODELS[name])
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def quantize_on_meta(model: nn.Module, scheme: str, head: bool, emb: bool) -> nn.Module:
    """``model`` with its decoder Linears (and ``lm_head`` with ``head``) as meta FP8Linear modules of
    ``scheme`` and the input embedding as a meta FP8Embedding with ``emb`` (tied to the head if shared)."""
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    tied = out_emb.weight is in_emb.weight
    new_head = None
    for name, mod in list(model.named_modules()):
        if type(mod) is nn.Linear and (mod is not out_emb or head):
            new = FP8Linear(mod.in_features, mod.out_features, mod.bias is not None, scheme, device="meta")
            model.set_submodule(name, new)
            new_head = new if mod is out_emb else new_head
    if emb:
        name = next(n for n, m in model.named_modules() if m is in_emb)
        fp8 = FP8Embedding(in_emb.num_embeddings, in_emb.embedding_dim, in_emb.padding_idx, torch.bfloat16, device="meta")
        if tied and new_head is not None:
            tie_to_head(fp8, new_head)
        model.set_submodule(name, fp8)
    return model


def memory_table(scheme: str) -> dict:
    """``{model: {variant: {"gb", "fraction"}}}`` of :data:`VARIANTS`, from shapes on the meta device."""
    out = {}
    for name in MODELS:
        rows = {}
        for label, fp8, head, emb in VARIANTS:
            model = meta_model(name)
            if fp8:
                quantize_on_meta(model, scheme, head, emb)
            rows[label] = weight_bytes([model])
        base = rows["bf16"]
        out[name] = {k: {"gb": v / 1e9, "fraction": v / base} for k, v in rows.items()}
        print(f"{name} ({MODELS[name]['num_hidden_layers']} layers, vocab {MODELS[name]['vocab_size']}), {scheme}: "
              + "; ".join(f"{k} {v['gb']:.2f} GB ({v['fraction']:.3f}x)" for k, v in out[name].items()), flush=True)
    return out


def untied(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose ``lm_head`` has its own copy of the tied table (the same values)."""
    out = copy.deepcopy(model)
    out.config.tie_word_embeddings = False
    out.lm_head.weight = nn.Parameter(out.lm_head.weight.detach().clone(), requires_grad=False)
    return out


def accuracy(scheme: str, dtype: torch.dtype, windows: int, split: bool = False) -> dict:
    """KL / top-1 / perplexity of SmolLM2 quantized with ``scheme``, without and with FP8 head + embedding
    (one shared table); with ``split`` instead each alone on an untied copy (the head then through GPTQ)."""
    from fp8_linear.models import load_model

    ref, tok = load_model("smollm2")
    ref = ref.to(dtype).eval()
    models, times = {"unquantized": ref}, {}
    runs = [(scheme, ref, {}), (f"{scheme} +head +emb", ref, dict(quantize_lm_head=True, quantize_embeddings=True))]
    if split == "tied":
        runs = runs[1:]
    elif split:
        runs = [(f"{scheme} +head (untied)", untied(ref), dict(quantize_lm_head=True)),
                (f"{scheme} +emb (untied)", untied(ref), dict(quantize_embeddings=True))]
    for label, base, kw in runs:
        t0 = time.perf_counter()
        models[label] = quantize_model(copy.deepcopy(base), None, scheme, tokenizer=tok, progress=False, **kw)
        times[label] = time.perf_counter() - t0
    batches = eval_batches(tok, max_windows=windows)
    res = evaluate_models(models, "unquantized", batches, progress=False)
    out = {}
    for n, r in res.items():
        out[n] = dict(kl=r.kl, top1_agreement=r.top1_agreement, perplexity=r.perplexity, tokens=r.tokens,
                      weight_bytes=weight_bytes([models[n]]))
        print(f"SmolLM2 {dtype} {n}: KL {r.kl:.5f} nats/token, top-1 {r.top1_agreement:.4f}, perplexity {r.perplexity:.3f} "
              f"({r.tokens} tokens), weights {out[n]['weight_bytes'] / 2**20:.1f} MiB", flush=True)
    out["quantize_s"] = times
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="fp8-channel")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--windows", type=int, default=16, help="eval windows of 512 tokens (the eval split holds 63)")
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument("--split", action="store_true",
                    help="instead: the FP8 head alone and the FP8 embedding alone, each on an untied copy of SmolLM2")
    ap.add_argument("--tied-only", action="store_true", help="instead: only the FP8 head + embedding (one table)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    doc = {"date": stamp.isoformat(timespec="seconds"), "args": vars(args), "torch": torch.__version__,
           "memory": memory_table(args.scheme)}
    if not args.memory_only:
        doc["smollm2"] = accuracy(args.scheme, getattr(torch, args.dtype), args.windows, "tied" if args.tied_only else args.split)
    out = pathlib.Path(args.out or f"benchmarks/results/fp8_head_embedding_{stamp:%Y%m%d}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
