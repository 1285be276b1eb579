"""``FP8Embedding``: the lookup against an fp64 reference on the dequantized table, the quantization
against the original table (e4m3 rounding bounds), awkward shapes, bad inputs, dtype handling, state
dicts, the tie with an FP8 ``lm_head``, and zero graph breaks under ``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fp8_linear import PRESETS, FP8Embedding, FP8Linear, ScaleError, ShapeError
from fp8_linear.embedding import DTYPE_ANCHOR, shares_weights, tie_to_head

FMAX = 448.0
#: e4m3: 3 mantissa bits, so nearest rounding of a normal value errs by at most 2^-4 of it; below the
#: smallest normal (2^-6) the spacing is 2^-9, so the absolute error is at most 2^-10 (times the scale).
E4M3_REL, E4M3_SUBNORMAL_ABS = 2.0**-4, 2.0**-10
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _table(v: int, d: int, seed: int = 0, dtype=torch.float32) -> nn.Embedding:
    g = torch.Generator().manual_seed(seed)
    emb = nn.Embedding(v, d)
    with torch.no_grad():
        w = torch.randn(v, d, generator=g) * torch.logspace(-3, 1, v).unsqueeze(1)  # rows of every scale
        emb.weight.copy_(w)
    return emb.to(dtype)


def _reference(mod: FP8Embedding, ids: torch.Tensor) -> torch.Tensor:
    """fp64 rows of the dequantized table, ``weight.double() * weight_scale.double()`` (independent of the package)."""
    table = mod.weight.double() * mod.weight_scale.double()
    return table[ids]


@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("v,d,ids_shape", [(257, 64, (3, 5)), (1, 1, (4,)), (10, 3, ()), (50, 130, (2, 0)), (33, 7, (2, 3, 4))])
def test_lookup_matches_fp64_reference(dtype, v, d, ids_shape):
    mod = FP8Embedding.from_embedding(_table(v, d), dtype=dtype)
    ids = torch.randint(0, v, ids_shape, generator=torch.Generator().manual_seed(1))
    out = mod(ids)
    assert out.dtype == dtype and out.shape == (*ids_shape, d)
    ref = _reference(mod, ids)
    # the e4m3 x fp32 product is exact in fp64 and fp32 rounds it once; then one rounding to ``dtype``
    assert torch.equal(out, ref.to(torch.float32).to(dtype))
    if out.numel():
        half_ulp = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}[dtype]
        err = (out.double() - ref).abs()
        tiny = torch.finfo(dtype).tiny if dtype != torch.float16 else 2.0**-24
        assert bool((err <= ref.abs() * half_ulp * 1.01 + tiny).all())


def test_int32_ids_and_every_row():
    mod = FP8Embedding.from_embedding(_table(300, 16))
    ids = torch.arange(300, dtype=torch.int32)
    assert torch.equal(mod(ids), mod(ids.long()))
    assert torch.equal(mod(ids).double(), mod.dequantized_weight(torch.float64))


def test_quantization_is_rowwise_minmax_nearest():
    emb = _table(200, 96, seed=3)
    mod = FP8Embedding.from_embedding(emb)
    w = emb.weight.detach().double()
    amax = w.abs().amax(dim=1, keepdim=True)
    assert torch.equal(mod.weight_scale, (amax.float() / torch.tensor(FMAX)).float())
    assert mod.weight.dtype == torch.float8_e4m3fn and mod.weight_scale.shape == (200, 1)
    assert bool((mod.weight.float().abs().amax(dim=1) == FMAX).all())  # each row's largest value maps to 448
    s = mod.weight_scale.double()
    err = (mod.dequantized_weight(torch.float64) - w).abs()
    bound = torch.maximum(w.abs() * E4M3_REL, s * E4M3_SUBNORMAL_ABS) * (1 + 1e-6)
    assert bool((err <= bound).all())


def test_padding_idx_and_zero_rows():
    emb = nn.Embedding(20, 8, padding_idx=-1)  # normalized to 19, as nn.Embedding does
    mod = FP8Embedding.from_embedding(emb)
    assert mod.padding_idx == emb.padding_idx == 19
    assert torch.count_nonzero(mod(torch.tensor([19]))) == 0
    assert mod.weight_scale[19].item() > 0  # an all-zero row gets the floor scale, never 0


def test_dtype_follows_model_and_fp8_stays():
    mod = FP8Embedding.from_embedding(_table(16, 8))
    assert mod.output_dtype == torch.float32
    w = mod.weight
    mod.to(torch.bfloat16)
    assert mod(torch.tensor([1])).dtype == torch.bfloat16 and mod.weight is w and w.dtype == torch.float8_e4m3fn
    mod.half()
    assert mod.output_dtype == torch.float16 and mod.weight_scale.dtype == torch.float32
    with pytest.raises(TypeError, match="float64"):
        mod.double()
    assert mod.output_dtype == torch.float32


def test_model_dtype_is_the_models_not_fp8():
    """transformers reads ``model.dtype`` from the first floating-point parameter (the static-cache mask is
    built in it): with the FP8 table first it must still say the model's dtype."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model.model.embed_tokens = FP8Embedding.from_embedding(model.model.embed_tokens)
    for lin in ("q_proj", "k_proj", "v_proj", "o_proj"):
        attn = model.model.layers[0].self_attn
        setattr(attn, lin, FP8Linear.from_linear(getattr(attn, lin), "fp8-dynamic"))
    assert model.dtype == torch.bfloat16
    assert DTYPE_ANCHOR not in model.state_dict() and "model.embed_tokens.dtype_anchor" not in model.state_dict()
    # min_new_tokens: random weights may pick the config's EOS id (2) and stop generate early
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, min_new_tokens=3, do_sample=False,
                         pad_token_id=0)
    assert out.shape == (1, 6)


def test_bad_inputs():
    mod = FP8Embedding.from_embedding(_table(10, 4))
    with pytest.raises(TypeError, match="torch.Tensor"):
        mod([1, 2])
    with pytest.raises(TypeError, match="int64 or int32"):
        mod(torch.tensor([1.0]))
    with pytest.raises(TypeError, match="int64 or int32"):
        mod(torch.tensor([True]))
    with pytest.raises(ValueError, match="device"):
        mod(torch.zeros(2, dtype=torch.long, device="meta"))
    with pytest.raises(IndexError):
        mod(torch.tensor([10]))
    with pytest.raises(TypeError, match="nn.Embedding"):
        FP8Embedding.from_embedding(nn.Linear(4, 4))

    class Scaled(nn.Embedding):
        pass

    with pytest.raises(TypeError, match="subclass"):
        FP8Embedding.from_embedding(Scaled(4, 4))
    with pytest.raises(ValueError, match="max_norm"):
        FP8Embedding.from_embedding(nn.Embedding(4, 4, max_norm=1.0))
    bad = nn.Embedding(4, 4)
    with torch.no_grad():
        bad.weight[2, 1] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        FP8Embedding.from_embedding(bad)
    with pytest.raises(TypeError, match="dtype"):
        FP8Embedding.from_embedding(nn.Embedding(4, 4).double())
    with pytest.raises(TypeError, match="dtype"):
        FP8Embedding(4, 4, dtype=torch.int8)
    for v, d in ((0, 4), (4, -1), (4.0, 4), (True, 4)):
        with pytest.raises(ShapeError):
            FP8Embedding(v, d)
    with pytest.raises(ValueError, match="padding_idx"):
        FP8Embedding(4, 4, padding_idx=4)


def test_state_dict_round_trip_and_refusals():
    src = FP8Embedding.from_embedding(_table(12, 6))
    sd = src.state_dict()
    assert set(sd) == {"weight", "weight_scale"}
    dst = FP8Embedding(12, 6, dtype=torch.float32)
    dst.load_state_dict(sd)  # strict: the anchor is not expected
    ids = torch.arange(12)
    assert torch.equal(dst(ids), src(ids))
    with pytest.raises(TypeError, match="weight: expected dtype"):
        dst.load_state_dict({"weight": sd["weight"].float(), "weight_scale": sd["weight_scale"]})
    with pytest.raises(ShapeError, match="weight"):
        dst.load_state_dict({"weight": sd["weight"][:5], "weight_scale": sd["weight_scale"]})
    zero = sd["weight_scale"].clone()
    zero[3] = 0
    with pytest.raises(ScaleError, match="weight_scale"):
        dst.load_state_dict({"weight": sd["weight"], "weight_scale": zero})
    with pytest.raises(ScaleError, match="weight_scale"):
        dst.load_state_dict({"weight": sd["weight"], "weight_scale": sd["weight_scale"][:6]})
    dst.check()


def _head_for(emb: nn.Embedding, scheme="fp8-dynamic") -> FP8Linear:
    lin = nn.Linear(emb.embedding_dim, emb.num_embeddings, bias=False)
    lin.weight = emb.weight
    return FP8Linear.from_linear(lin, scheme)


def test_tie_to_head_shares_one_table():
    emb = _table(256, 128, seed=5)
    head = _head_for(emb)
    mod = tie_to_head(FP8Embedding.from_embedding(emb), head)
    assert shares_weights(mod, head)
    assert mod.weight is head.weight and mod.weight_scale is head.weight_scale
    # the per-channel head scale is the per-row embedding scale: the same bytes either way
    alone = FP8Embedding.from_embedding(emb)
    assert torch.equal(alone.weight.view(torch.uint8), mod.weight.view(torch.uint8))
    assert torch.equal(alone.weight_scale, mod.weight_scale)
    ids = torch.arange(256)
    assert torch.equal(mod(ids).double(), head.dequantized_weight(torch.float64).float().double())


def test_tie_to_head_refusals():
    emb = _table(256, 128)
    with pytest.raises(ValueError, match="block"):
        tie_to_head(FP8Embedding.from_embedding(emb), _head_for(emb, "fp8-block"))
    with pytest.raises(ValueError, match="weight dtype"):
        tie_to_head(FP8Embedding.from_embedding(emb), _head_for(emb, PRESETS["fp8-dynamic"].with_(fmt="e5m2")))
    with pytest.raises(ValueError, match=r"\[256, 128\]"):
        tie_to_head(FP8Embedding.from_embedding(_table(128, 256)), _head_for(emb))
    biased = FP8Linear.from_linear(nn.Linear(128, 256), "fp8-dynamic")
    with pytest.raises(ValueError, match="bias"):
        tie_to_head(FP8Embedding.from_embedding(emb), biased)
    with pytest.raises(TypeError, match="FP8Linear"):
        tie_to_head(FP8Embedding.from_embedding(emb), nn.Linear(128, 256))


@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_zero_graph_breaks(ids_dtype):
    torch._dynamo.reset()
    mod = FP8Embedding.from_embedding(_table(64, 32), dtype=torch.bfloat16)
    ids = torch.randint(0, 64, (2, 7), dtype=ids_dtype)
    explain = torch._dynamo.explain(mod)(ids)
    assert explain.graph_break_count == 0 and explain.graph_count == 1


def test_compiled_fullgraph_equals_eager_cpu():
    torch._dynamo.reset()
    mod = FP8Embedding.from_embedding(_table(64, 32), dtype=torch.bfloat16)
    ids = torch.randint(0, 64, (3, 5))
    compiled = torch.compile(mod, fullgraph=True)
    assert torch.equal(compiled(ids), mod(ids))


@pytest.mark.gpu
def test_cuda_matches_cpu_and_compiles():
    torch._dynamo.reset()
    cpu = FP8Embedding.from_embedding(_table(1000, 256, seed=7), dtype=torch.bfloat16)
    gpu = FP8Embedding.from_embedding(_table(1000, 256, seed=7).cuda(), dtype=torch.bfloat16)
    assert torch.equal(gpu.weight.view(torch.uint8).cpu(), cpu.weight.view(torch.uint8))
    assert torch.equal(gpu.weight_scale.cpu(), cpu.weight_scale)
    ids = torch.randint(0, 1000, (4, 33))
    eager = gpu(ids.cuda())
    assert torch.equal(eager.cpu(), cpu(ids))
    assert torch._dynamo.explain(gpu)(ids.cuda()).graph_break_count == 0
    torch._dynamo.reset()
    assert torch.equal(torch.compile(gpu, fullgraph=True)(ids.cuda()), eager)
    graphed = torch.compile(gpu, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        out = graphed(ids.cuda())
    assert torch.equal(out, eager)
