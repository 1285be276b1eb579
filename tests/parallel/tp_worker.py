"""One rank of the tensor-parallel check: the same FP8 Llama-shaped model on every rank, its single-device
logits, then the tensor-parallel logits; the differences are written to ``<out>/rank<r>.json``.

Run by tests/parallel/test_tensor_parallel.py (``gloo``, CPU, emulated backend) and, on a machine with
two GPUs, by ``torchrun --nproc-per-node 2 tests/parallel/tp_worker.py --out DIR`` (``nccl``, our kernel).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch
import torch.distributed as dist

PRESETS = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
#: A Llama-shaped model small enough for CPU, with widths that split over 2 ranks on 128 boundaries.
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=2, vocab_size=512, max_position_embeddings=256)


import fp8_linear  # noqa: E402,F401  (first: tests/fp8_linear must not shadow the package)

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers
from helpers import calc_diff  # noqa: E402


#: A reference top-2 logit gap above which the argmax is decided (several bf16 ulps of logits near 1).
DECIDED_MARGIN = 0.05


def build(preset: str, device: str, dtype: torch.dtype, seed: int = 0):
    """The same model on every rank: seeded random weights, FP8 projections from ``from_linear``,
    static input scales from the amax of one seeded calibration batch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fp8_linear import FP8Linear

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).to(device=device, dtype=dtype).eval()
    calib = torch.randint(0, TINY["vocab_size"], (2, 64), generator=torch.Generator().manual_seed(seed + 1)).to(device)
    amax, hooks = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            hooks.append(mod.register_forward_hook(
                lambda m, i, o, n=name: amax.__setitem__(n, max(amax.get(n, 0.0), i[0].abs().max().item()))))
    with torch.no_grad():
        model(calib)
    for h in hooks:
        h.remove()
    for name in amax:
        parent, _, leaf = name.rpartition(".")
        p = model.get_submodule(parent)
        setattr(p, leaf, FP8Linear.from_linear(getattr(p, leaf), preset, input_amax=amax[name]))
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=256, help="prompt length of the check")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and os.environ.get("FP8_LINEAR_TP_CPU") != "1"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = f"cuda:{rank % torch.cuda.device_count()}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16
    from fp8_linear.parallel import tensor_parallelize

    ids = torch.randint(0, TINY["vocab_size"], (1, args.tokens), generator=torch.Generator().manual_seed(7)).to(device)
    result = {}
    for preset in PRESETS:
        model = build(preset, device, dtype)
        with torch.no_grad():
            ref = model(ids).logits.float()
            tp = tensor_parallelize(copy.deepcopy(model))
            out = tp(ids).logits.float()
        agree = out.argmax(-1) == ref.argmax(-1)
        top2 = ref.topk(2, dim=-1).values
        decided = (top2[..., 0] - top2[..., 1]) > DECIDED_MARGIN
        q = tp.model.layers[0].self_attn.q_proj
        result[preset] = {
            "calc_diff": float(calc_diff(out, ref)),
            "top1_agree": float(agree.float().mean()),
            "top1_agree_decided": float(agree[decided].float().mean()) if decided.any() else 1.0,
            "finite": bool(torch.isfinite(out).all()),
            "q_rows_local": int(q.local.weight.shape[0]),
            "world": dist.get_world_size(),
        }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
