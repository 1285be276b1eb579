"""benchmarks/e2e.py ``--fp8-lm-head`` / ``--fp8-embedding``: the rows they add, the modules a path swaps
in (and back), the BF16 ones it holds aside, and the weight memory the row reports."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks import e2e
from benchmarks.common.fp8_swap import decoder_linears
from benchmarks.common.random_model import MODELS, TINY, build_model, from_fields
from benchmarks.common.weight_memory import weight_bytes
from fp8_linear import FP8Embedding, FP8Linear
from fp8_linear.embedding import shares_weights


def test_flags_label_the_fp8_rows():
    args = e2e.parse_args(["--fp8-lm-head", "--fp8-embedding"])
    assert args.fp8_lm_head and args.fp8_embedding
    paths = e2e.plan_paths(["fp8-channel"], ["fp8-channel"], [], [False], False, args.fp8_lm_head, args.fp8_embedding)
    assert [p.label for p in paths] == ["bf16", "fp8-channel ours +head +emb"]
    assert not paths[0].fp8_lm_head and paths[1].fp8_lm_head and paths[1].fp8_embedding
    assert not e2e.parse_args([]).fp8_lm_head


def _swapped(model, path):
    bf16 = dict(decoder_linears(model))
    amax = {n: 1.0 for n in bf16}
    amax["lm_head"] = e2e.head_input_amax(model, tokens=16)
    return bf16, amax


def test_path_swaps_head_and_embedding_and_back():
    model = build_model("llama3-8b", 1, "cpu", tiny=True)
    head, emb = model.lm_head, model.model.embed_tokens
    path = e2e.PathSpec("x", "fp8", "fp8-channel", None, False, True, True)
    bf16, amax = _swapped(model, path)
    full = weight_bytes([model])
    with e2e.path_layers(model, path, bf16, amax) as (held, _info):
        assert isinstance(model.lm_head, FP8Linear) and model.lm_head.input_scale is not None
        assert isinstance(model.model.embed_tokens, FP8Embedding) and model.dtype == torch.bfloat16
        assert held == weight_bytes([*bf16.values(), head, emb])
        v, d = TINY["vocab_size"], TINY["hidden_size"]
        saved = 2 * (v * d * 2 - (v * d + v * 4)) - 4  # head and table: bf16 -> e4m3 + an fp32 scale per row; the head's input_scale
        lin = sum(m.weight.numel() * 2 - (m.weight.numel() + m.out_features * 4 + 4) for m in bf16.values())  # + input_scale
        assert weight_bytes([model]) == full - saved - lin
        ids = torch.randint(0, v, (1, 5))
        with torch.inference_mode():
            assert model(ids).logits.dtype == torch.bfloat16
    assert model.lm_head is head and model.model.embed_tokens is emb


def test_tied_model_keeps_one_table():
    fields = dict(MODELS["llama3-8b"], **TINY, tie_word_embeddings=True)
    model = from_fields(fields, 1, "cpu")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    path = e2e.PathSpec("x", "fp8", "fp8-dynamic", None, False, True, True)
    ends = e2e.fp8_ends(model, path, {})
    assert shares_weights(ends["model.embed_tokens"], ends["lm_head"])
    assert type(model.lm_head) is nn.Linear  # fp8_ends builds, path_layers swaps
