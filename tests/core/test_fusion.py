"""Fused sibling projections (``fp8_linear.fuse_projections``, docs/serving.md "Fused projections").

What is checked, on the CPU (the emulated backend: the fusion only changes which weight and scale
tensors a layer's existing ops see, so it is the same code on every backend):

- numerics: every member's fused output against an fp64 reference on the dequantized inputs (the
  ``calc_diff`` bar of docs/design.md section 7) and against the member's own unfused GEMM within the
  bound of two FP32 summation orders, for every preset, awkward shapes and M, with and without bias;
- which groups fuse: the q/k/v and gate/up groups of a Llama, the members' weights row views of one
  buffer (no copy), state-dict keys unchanged; refusals with their reasons (differing static input
  scales, block scales with N not a multiple of 128, mixed static / dynamic, other formats) and typed
  errors for explicit groups that cannot be fused and bad arguments;
- call order and stray calls: any member order, a member called with another tensor
  (cross-attention) or alone, an exception inside the parent: outputs equal the unfused ones and no
  tensor stays cached after a forward;
- ``torch.compile``: zero graph breaks for a whole tiny Llama forward, 4 FP8 GEMMs per decoder layer
  in the graph instead of 7, no recompiles over the decode steps of a compiled static-cache
  ``generate``, no in-place ops in the traced graph;
- round trips: ``save_quantized`` of a fused model writes the unfused checkpoint (same keys, same
  bytes) and loads back, ``unfuse_projections`` restores the tensors bitwise, ``load_state_dict``,
  device / dtype moves and ``deepcopy`` of a fused model;
- greedy tokens: fused and unfused SmolLM2 (bundled) give the same first 32 greedy tokens, eager and
  under the compiled static cache.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fp8_linear
from fp8_linear import FP8Linear, FusionError, fuse_projections, quantize_fp8, unfuse_projections
from fp8_linear.fusion import FusedFP8Linear, fusion_groups, launched_layers
from fp8_models import swap_in_fp8
from helpers import calc_diff, dequant64, gemm_ref64, rounding_bar

PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]
#: Calibrated input amax of the static presets (inputs are N(0, 1) * 2).
INPUT_AMAX = 7.0
#: Unit roundoff of fp32 (the accumulation of every backend).
U32 = 2.0**-24
_MANTISSA = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
QKV = ("q_proj", "k_proj", "v_proj")
#: A 2-layer Llama with awkward widths (192 / 320: not multiples of 128); tied embeddings.
TINY = dict(vocab_size=256, hidden_size=192, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
#: Widens the default init (std 0.02) so that the random model's top-1 tokens are well separated.
WEIGHT_GAIN = 5.0


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


def _fp8(k: int, n: int, preset, bias=True, amax=INPUT_AMAX, dtype=torch.float32) -> FP8Linear:
    return FP8Linear.from_linear(nn.Linear(k, n, bias=bias, dtype=dtype), preset, input_amax=amax)


class _Qkv(nn.Module):
    """Three sibling FP8 projections; ``forward(x, kv=None, order=QKV)`` calls them in ``order`` on ``x``
    (k and v on ``kv`` when given, as cross-attention does) and returns ``{name: output}``."""

    def __init__(self, preset, k: int, ns, bias=True, dtype=torch.float32):
        super().__init__()
        for name, n in zip(QKV, ns):
            setattr(self, name, _fp8(k, n, preset, bias, dtype=dtype))

    def forward(self, x, kv=None, order=QKV):
        return {n: getattr(self, n)(x if kv is None or n == "q_proj" else kv) for n in order}


def _ref64(layer: FP8Linear, x: torch.Tensor) -> torch.Tensor:
    """fp64 ``dequant(q(x)) @ dequant(W).T + b`` of an (unfused) FP8Linear, ``x`` ``[M, K]``."""
    gran = layer.scheme.activation_granularity
    s = layer.input_scale
    q, sa = quantize_fp8(x.float(), layer.weight.dtype, gran, scale=None if s is None else s)
    return gemm_ref64(q, layer.weight, sa, layer.weight_scale, layer.bias)


def _order_bound(layer: FP8Linear, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Largest difference two FP32 summation orders of ``layer(x)`` can show: ``2 K u32 sum|a b|``
    plus one unit in the last place of the output dtype (a rounding that falls the other way)."""
    gran = layer.scheme.activation_granularity
    q, sa = quantize_fp8(x.float(), layer.weight.dtype, gran, scale=layer.input_scale)
    absref = dequant64(q, sa).abs() @ dequant64(layer.weight, layer.weight_scale).abs().t()
    k = x.shape[-1]
    ulp = torch.exp2(torch.floor(torch.log2(out.double().abs().clamp_min(1e-30))) - _MANTISSA[out.dtype])
    return 2 * k * U32 * absref + ulp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,ns", [(200, (72, 40, 40)), (256, (256, 128, 128)), (1040, (136, 24, 264))])
@pytest.mark.parametrize("preset", PRESETS)
def test_fused_outputs_match_reference_and_unfused(preset, k, ns, dtype):
    block_ok = all(n % 128 == 0 for n in ns)
    mod = _Qkv(preset, k, ns, bias=True, dtype=dtype)
    twin = copy.deepcopy(mod)  # stays unfused
    rep = fuse_projections(mod)
    if preset == "fp8-block" and not block_ok:
        assert not rep.fused and "multiple of 128" in rep.skipped[0].reason
        return
    assert len(rep.fused) == 1 and rep.fused[0].rows == ns
    for m in (1, 7, 127):
        x = (torch.randn(m, k) * 2).to(dtype)
        with torch.no_grad():
            fused, apart = mod(x), twin(x)
        for name in QKV:
            ref = _ref64(getattr(twin, name), x)
            assert fused[name].shape == (m, ns[QKV.index(name)]) and fused[name].dtype == dtype
            bar = rounding_bar(ref, dtype)
            assert calc_diff(apart[name], ref) <= bar, (preset, name, m)  # the reference is the layer's
            assert calc_diff(fused[name], ref) <= bar, (preset, name, m, calc_diff(fused[name], ref), bar)
            bound = _order_bound(getattr(twin, name), x, apart[name])
            assert ((fused[name].double() - apart[name].double()).abs() <= bound).all(), (preset, name, m)
    assert all(g._state is None for g in fusion_groups(mod))


@pytest.fixture
def split_rows(monkeypatch):
    """Sets ``FP8_LINEAR_SPLIT_ROWS`` (the rows from which an eager fused group runs its members' GEMMs apart
    on one quantized input) for the test; the settings are read again before and after."""
    from fp8_linear import settings

    def set_rows(rows: int) -> None:
        monkeypatch.setenv(settings.SPLIT_ROWS_ENV, str(rows))
        settings.reload()

    yield set_rows
    monkeypatch.delenv(settings.SPLIT_ROWS_ENV, raising=False)
    settings.reload()


@pytest.mark.parametrize("preset", PRESETS)
def test_prefill_sized_inputs_quantize_once_and_give_contiguous_outputs(preset, split_rows, monkeypatch):
    """From FP8_LINEAR_SPLIT_ROWS rows a fused group quantizes its input once and runs each member's own GEMM
    into a contiguous output (eager pointwise ops on the fused output's column slices take PyTorch's
    strided kernels): the outputs are then the unfused members' own, bit for bit on the emulated backend
    (the same quantization and GEMM op); below the threshold, with 0, and for block-scaled groups (no
    split) the members get column slices of the one fused GEMM."""
    from fp8_linear import fusion

    k, ns = 256, (256, 128, 128)
    mod = _Qkv(preset, k, ns)
    twin = copy.deepcopy(mod)
    fuse_projections(mod)
    calls = []
    real = fusion.quantize_activation
    monkeypatch.setattr(fusion, "quantize_activation", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(9, k) * 2
    with torch.no_grad():
        apart = twin(x)
        split_rows(8)
        got = mod(x)
        splits = preset != "fp8-block"
        assert len(calls) == (1 if splits else 0)
        for name in QKV:
            if splits:
                assert got[name].is_contiguous() and torch.equal(got[name], apart[name]), (preset, name)
        assert splits or not got["k_proj"].is_contiguous()
        for rows in (10, 0):  # below the threshold; never
            split_rows(rows)
            got = mod(x)
            assert not got["k_proj"].is_contiguous() and len(calls) == (1 if splits else 0)
            for name in QKV:
                bound = _order_bound(getattr(twin, name), x, apart[name])
                assert ((got[name].double() - apart[name].double()).abs() <= bound).all(), (preset, name, rows)
    assert all(g._state is None for g in fusion_groups(mod)) and not fusion._ROUNDS


def test_split_rows_setting_rejects_what_is_not_a_row_count():
    from fp8_linear import settings

    assert settings.Settings.from_environ({}).split_rows == settings.SPLIT_ROWS_DEFAULT
    assert settings.Settings.from_environ({settings.SPLIT_ROWS_ENV: " 0 "}).split_rows == 0
    for bad in ("-1", "1.5", "many"):
        with pytest.raises(ValueError, match="FP8_LINEAR_SPLIT_ROWS"):
            settings.Settings.from_environ({settings.SPLIT_ROWS_ENV: bad})


def test_mixed_tensor_and_channel_members_fuse_exactly():
    mod = _Qkv("fp8-tensor", 192, (64, 64, 32))
    mod.v_proj = _fp8(192, 32, "fp8-channel")  # same static input_scale, per-channel weight scale
    twin = copy.deepcopy(mod)
    rep = fuse_projections(mod)
    assert rep.fused and rep.fused[0].weight_kind == "channel"
    x = torch.randn(5, 192) * 2
    with torch.no_grad():
        fused, apart = mod(x), twin(x)
    for n in QKV:
        assert calc_diff(fused[n], _ref64(getattr(twin, n), x)) <= rounding_bar(_ref64(getattr(twin, n), x), torch.float32)


def _random_ids(shape, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def _llama(preset: str, **overrides):
    """A seeded random :data:`TINY` Llama (fp32) with its decoder Linears as ``FP8Linear`` of ``preset``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**dict(TINY, **overrides))).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(WEIGHT_GAIN)
    ids = _random_ids((2, 12), seed=1)
    return swap_in_fp8(model, ids, preset), ids


def test_llama_groups_views_and_state_dict():
    model, ids = _llama("fp8-channel")
    keys = {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()}
    nparams = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        before = model(ids).logits
    rep = fuse_projections(model)
    assert [g.members for g in rep.fused] == [QKV, ("gate_proj", "up_proj")] * 2, rep
    assert rep.layers_removed == 6 and not rep.skipped
    assert "2 x q_proj/k_proj/v_proj" in str(rep)
    for g in fusion_groups(model):
        fw = g.fused.weight
        for m, (start, stop) in zip(g.members, g.bounds):
            assert isinstance(m, FP8Linear) and type(m) is FusedFP8Linear
            assert m.weight.untyped_storage().data_ptr() == fw.untyped_storage().data_ptr()
            assert m.weight.data_ptr() == fw[start:stop].data_ptr() and m.weight.is_contiguous()
            assert m.weight_scale.data_ptr() == g.fused.weight_scale[start:stop].data_ptr()
    assert {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()} == keys
    assert sum(p.numel() for p in model.parameters()) == nparams
    with torch.no_grad():
        after = model(ids).logits
    assert calc_diff(after, before) < 1e-10  # emulated: the same products, summed in fp32
    layers = [m for n, m in model.named_modules() if isinstance(m, FP8Linear)]
    assert len(launched_layers(layers)) == 4 * 2
    assert "fused with q_proj/k_proj/v_proj" in repr(model.model.layers[0].self_attn.q_proj)


def test_refusals_are_reported():
    mod = _Qkv("fp8-tensor", 64, (32, 16, 16))
    mod.k_proj = _fp8(64, 16, "fp8-tensor", amax=5.0)
    rep = fuse_projections(mod)
    assert not rep.fused and "input_scale values differ" in rep.skipped[0].reason
    mod = _Qkv("fp8-dynamic", 64, (32, 16, 16))
    mod.v_proj = _fp8(64, 16, "fp8-channel")
    assert "static and dynamic" in fuse_projections(mod).skipped[0].reason
    mod = _Qkv("fp8-dynamic", 64, (32, 16, 16))
    mod.v_proj = _fp8(64, 16, fp8_linear.PRESETS["fp8-dynamic"].with_(fmt="e5m2", name="e5m2"))
    assert "FP8 formats differ" in fuse_projections(mod).skipped[0].reason
    mod = _Qkv("fp8-dynamic", 64, (32, 16, 16))
    mod.v_proj = _fp8(48, 16, "fp8-dynamic")
    assert "in_features differ" in fuse_projections(mod).skipped[0].reason
    mod = _Qkv("fp8-block", 256, (256, 64, 64))
    assert "multiple of 128" in fuse_projections(mod).skipped[0].reason
    mod = _Qkv("fp8-dynamic", 64, (32, 16, 16))
    mod.v_proj = nn.Linear(64, 16)
    assert "not every member is an FP8Linear" in fuse_projections(mod).skipped[0].reason
    mod = _Qkv("fp8-dynamic", 64, (32, 16, 16))
    fuse_projections(mod)
    assert "already fused" in fuse_projections(mod).skipped[0].reason


def test_explicit_groups_and_bad_arguments():
    mod = _Qkv("fp8-dynamic", 64, (32, 16, 16))
    rep = fuse_projections(mod, groups=[["k_proj", "v_proj"]])
    assert [g.members for g in rep.fused] == [("k_proj", "v_proj")] and type(mod.q_proj) is FP8Linear
    x = torch.randn(3, 64)
    twin = copy.deepcopy(mod)
    unfuse_projections(twin)
    with torch.no_grad():
        assert all(calc_diff(mod(x)[n], twin(x)[n]) < 1e-12 for n in QKV)
    bad = _Qkv("fp8-tensor", 64, (32, 16, 16))
    bad.k_proj = _fp8(64, 16, "fp8-tensor", amax=5.0)
    with pytest.raises(FusionError, match="input_scale values differ"):
        fuse_projections(bad, groups=[["q_proj", "k_proj"]])
    with pytest.raises(FusionError, match="no module"):
        fuse_projections(bad, groups=[["q_proj", "nope"]])
    with pytest.raises(FusionError, match="two or more distinct"):
        fuse_projections(bad, groups=[["q_proj", "q_proj"]])
    with pytest.raises(FusionError, match="every member must be an FP8Linear"):
        fuse_projections(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), groups=[["0", "1"]])
    model, _ = _llama("fp8-dynamic")
    with pytest.raises(FusionError, match="one parent"):
        fuse_projections(model, groups=[["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"]])
    with pytest.raises(FusionError, match="more than one group"):
        fuse_projections(_Qkv("fp8-dynamic", 64, (32, 16, 16)), groups=[["q_proj", "k_proj"], ["q_proj", "v_proj"]])
    with pytest.raises(TypeError, match="groups"):
        fuse_projections(mod, groups="q_proj")
    with pytest.raises(TypeError, match="groups"):
        fuse_projections(mod, groups=["q_proj"])
    with pytest.raises(TypeError, match="patterns"):
        fuse_projections(mod, patterns=["q_proj"])
    with pytest.raises(TypeError, match="model"):
        fuse_projections("model")
    with pytest.raises(TypeError, match="made by"):
        FusedFP8Linear(4, 4)


def test_any_call_order_cross_attention_and_lone_calls():
    mod = _Qkv("fp8-channel", 96, (48, 32, 32))
    twin = copy.deepcopy(mod)
    fuse_projections(mod)
    (group,) = fusion_groups(mod)
    x, enc = torch.randn(4, 96) * 2, torch.randn(9, 96) * 2
    with torch.no_grad():
        ref = twin(x)
        for order in [("v_proj", "q_proj", "k_proj"), ("k_proj", "v_proj", "q_proj"), QKV + ("k_proj",)]:
            out = mod(x, order=order)
            assert all(torch.equal(out[n], mod(x)[n]) for n in set(order))
            assert all(calc_diff(out[n], ref[n]) < 1e-12 for n in set(order))
            assert group._state is None and group.enabled
        # a member called alone, outside its parent's forward: its own GEMM, nothing cached
        assert calc_diff(mod.k_proj(enc), twin.k_proj(enc)) < 1e-12 and group._state is None
        # cross-attention: q on x, k / v on the encoder states; correct, and the group stops fusing
        out, ref = mod(x, kv=enc), twin(x, kv=enc)
        assert all(calc_diff(out[n], ref[n]) < 1e-12 for n in QKV)
        assert not group.enabled and "did not call every member" in group.disabled_reason
        assert group._state is None
        assert all(calc_diff(mod(x)[n], twin(x)[n]) < 1e-12 for n in QKV)


def test_exception_inside_parent_leaves_no_cached_tensor():
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (_fp8(64, 16, "fp8-dynamic") for _ in range(3))

        def forward(self, x):
            self.q_proj(x)
            raise RuntimeError("boom")

    mod = Boom()
    fuse_projections(mod)
    (group,) = fusion_groups(mod)
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
        mod(torch.randn(2, 64))
    assert group._state is None


def test_cross_attention_parent_fuses_key_and_value_only():
    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder_attn = _Qkv("fp8-dynamic", 64, (32, 32, 32))

        def forward(self, x, enc):
            return self.encoder_attn(x, kv=enc)

    mod = Layer()
    twin = copy.deepcopy(mod)
    rep = fuse_projections(mod)
    assert [g.members for g in rep.fused] == [("k_proj", "v_proj")]
    x, enc = torch.randn(3, 64), torch.randn(5, 64)
    with torch.no_grad():
        out, ref = mod(x, enc), twin(x, enc)
    assert all(calc_diff(out[n], ref[n]) < 1e-12 for n in QKV) and fusion_groups(mod)[0].enabled


def _gemm_ops(gm) -> int:
    return sum(1 for node in gm.graph.nodes if node.op == "call_function" and "emulated_gemm" in str(node.target))


@pytest.mark.parametrize("preset", PRESETS)
def test_whole_llama_forward_traces_with_no_graph_break(preset):
    over = dict(hidden_size=256, intermediate_size=384) if preset == "fp8-block" else {}
    model, ids = _llama(preset, **over)
    with torch.no_grad():
        unfused = torch._dynamo.explain(model)(ids)
        torch._dynamo.reset()
        rep = fuse_projections(model)
        assert len(rep.fused) == 4, rep
        ex = torch._dynamo.explain(model)(ids)
    assert ex.graph_break_count == 0 and ex.graph_count == 1, ex.break_reasons
    assert _gemm_ops(unfused.graphs[0]) == 7 * 2 and _gemm_ops(ex.graphs[0]) == 4 * 2
    inplace = [n for n in ex.graphs[0].graph.nodes if n.op in ("call_function", "call_method")
               and str(getattr(n.target, "__name__", n.target)).endswith("_") and not str(n.target).startswith("_")]
    assert not inplace, inplace
    assert all(g._state is None for g in fusion_groups(model))


@pytest.mark.slow
def test_compiled_static_cache_decode_has_no_recompiles():
    from torch._dynamo.utils import counters
    from transformers.generation.configuration_utils import CompileConfig

    model, ids = _llama("fp8-tensor")
    twin = copy.deepcopy(model)
    fuse_projections(model)
    cc = CompileConfig(fullgraph=True)
    cc._compile_all_devices = True  # transformers compiles on accelerators only by default
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
    counters.clear()
    with torch.inference_mode():
        out = model.generate(ids, cache_implementation="static", compile_config=cc, **kw)
        ref = twin.generate(ids, **kw)
    assert not counters["recompiles"], dict(counters["recompiles"])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert torch.equal(out, ref)
    assert all(g.enabled and g._state is None for g in fusion_groups(model))


def test_save_quantized_writes_the_unfused_checkpoint(tmp_path):
    from safetensors.torch import load_file

    model, ids = _llama("fp8-channel")
    plain = fp8_linear.save_quantized(model, tmp_path / "plain")
    fuse_projections(model)
    fused = fp8_linear.save_quantized(model, tmp_path / "fused")
    a, b = load_file(f"{plain}/model.safetensors"), load_file(f"{fused}/model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k
    back = fp8_linear.load_quantized(fused, dtype=torch.float32)
    with torch.no_grad():
        assert calc_diff(back(ids).logits, model(ids).logits) < 1e-10
    sd = model.state_dict()
    ptrs = [t.untyped_storage().data_ptr() for k, t in sd.items() if "layers.0.self_attn" in k and k.endswith("weight")]
    assert len(set(ptrs)) == len(ptrs)  # no storage shared between the saved tensors


@pytest.mark.parametrize("preset", PRESETS)
def test_unfuse_restores_tensors_bitwise(preset):
    model, ids = _llama(preset, hidden_size=256, intermediate_size=384)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fuse_projections(model)
    assert unfuse_projections(model) == 4 and not fusion_groups(model)
    after = model.state_dict()
    for k, v in before.items():
        assert after[k].dtype == v.dtype and torch.equal(after[k].view(torch.uint8), v.view(torch.uint8)), k
    attn = model.model.layers[0].self_attn
    assert type(attn.q_proj) is FP8Linear and not attn._forward_hooks and not attn._forward_pre_hooks
    assert attn.q_proj.weight.untyped_storage().data_ptr() != attn.k_proj.weight.untyped_storage().data_ptr()


def test_member_slot_is_its_one_fusion_record():
    """A member's ``_fusion_slot`` ``(key, index, start, stop)`` is all it records of its group: the index
    and rows are its position and the running sum of the out_features before it (recomputed here), and
    the paths that read the index (copy, load, move, repr) touch that member's rows and no other's."""
    # per-tensor member scales (a load copies them into the fused vector), biases (a cast makes a new fused bias)
    model, _ = _llama("fp8-tensor", attention_bias=True, mlp_bias=True)
    fuse_projections(model)

    def check(m: nn.Module) -> None:
        for g in fusion_groups(m):
            start = 0
            for i, (name, member) in enumerate(zip(g.names, g.members)):
                stop = start + member.out_features
                assert member.__dict__["_fusion_slot"] == (g.key, i, start, stop)
                assert not [a for a in member.__dict__ if a.startswith("_fusion") and a not in ("_fusion", "_fusion_slot")]
                assert member.weight.data_ptr() == g.fused.weight[start:stop].data_ptr(), name
                assert member.bias.data_ptr() == g.fused.bias[start:stop].data_ptr(), name
                assert f"(rows {start}:{stop} of {g.bounds[-1][1]})" in member.extra_repr()
                start = stop

    check(model)
    dup = copy.deepcopy(model)
    check(dup)
    k = dup.model.layers[1].self_attn.k_proj  # index 1: a load writes its rows of the copy's buffer only
    g = k._fusion
    before = [g.fused.weight.float().clone(), g.fused.weight_scale.clone()]
    new = [k.weight.float().flip(1).to(k.weight.dtype), k.weight_scale * 2]
    k.load_state_dict({**k.state_dict(), "weight": new[0], "weight_scale": new[1]})
    _, _, start, stop = k._fusion_slot
    assert torch.equal(g.fused.weight[start:stop].float(), new[0].float())
    assert torch.equal(g.fused.weight_scale[start:stop], new[1].reshape(1, 1).expand(stop - start, 1))
    for fused, old in zip((g.fused.weight.float(), g.fused.weight_scale), before):
        assert torch.equal(fused[:start], old[:start]) and torch.equal(fused[stop:], old[stop:])
    check(dup.to(torch.bfloat16))
    lone = copy.deepcopy(k)  # copied alone, its group and siblings with it: it views the copied buffer's rows
    assert lone._fusion is not g and lone._fusion.members[1] is lone
    check(nn.ModuleList([lone]))
    assert unfuse_projections(dup) == 4
    assert not [a for m in dup.modules() for a in m.__dict__ if a.startswith("_fusion")]


def test_group_keys_are_never_given_twice():
    """Registry keys of groups that are gone (unfused, or dead with their model) are not given to new groups."""
    import gc

    from fp8_linear.fusion import _GROUPS

    model, _ = _llama("fp8-dynamic")
    fuse_projections(model)
    seen = {g.key for g in fusion_groups(model)}
    unfuse_projections(model)
    assert seen.isdisjoint(_GROUPS)
    fuse_projections(model)
    again = {g.key for g in fusion_groups(model)}
    del model
    gc.collect()
    assert again.isdisjoint(_GROUPS) and again.isdisjoint(seen)
    other, _ = _llama("fp8-dynamic")
    fuse_projections(other)
    assert {g.key for g in fusion_groups(other)}.isdisjoint(seen | again)


def test_load_state_dict_moves_and_deepcopy():
    model, ids = _llama("fp8-tensor")
    other, _ = _llama("fp8-tensor")
    with torch.no_grad():
        for p in other.parameters():  # other weights and scales (the static input scales stay equal per group)
            if p.dtype == torch.float8_e4m3fn:
                p.copy_(p.float().flip(0).to(p.dtype))
            elif p.dim() == 1 and p.numel() == 1:
                p.mul_(1.25)
    fuse_projections(model)
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert calc_diff(model(ids).logits, other(ids).logits) < 1e-10
    assert all(g.enabled for g in fusion_groups(model))
    # load scales that differ between members: the group runs its members apart, still correct
    sd = other.state_dict()
    sd["model.layers.0.self_attn.k_proj.input_scale"] = sd["model.layers.0.self_attn.k_proj.input_scale"] * 2
    other.load_state_dict(sd)
    model.load_state_dict(sd)
    g0 = fusion_groups(model)[0]
    assert not g0.enabled and "input_scale values differ" in g0.disabled_reason
    with torch.no_grad():
        assert calc_diff(model(ids).logits, other(ids).logits) < 1e-10
    # a dtype move: the bias-free tiny Llama keeps FP8 weights; views survive; outputs follow the unfused twin
    model, ids = _llama("fp8-dynamic")
    twin = copy.deepcopy(model).to(torch.bfloat16)
    fuse_projections(model)
    model.to(torch.bfloat16)
    for g in fusion_groups(model):
        assert all(m.weight.untyped_storage().data_ptr() == g.fused.weight.untyped_storage().data_ptr() for m in g.members)
    with torch.no_grad():
        assert calc_diff(model(ids).logits, twin(ids).logits) < 1e-5
        dup = copy.deepcopy(model)
        assert fusion_groups(dup) and fusion_groups(dup)[0] is not fusion_groups(model)[0]
        assert torch.equal(dup(ids).logits, model(ids).logits)
        assert all(g._state is None for g in fusion_groups(dup) + fusion_groups(model))
    # unfusing the copy leaves the original fused, its hooks in place
    assert unfuse_projections(dup) == 4 and len(fusion_groups(model)) == 4
    attn = model.model.layers[0].self_attn
    assert len(attn._forward_pre_hooks) == 1 and len(attn._forward_hooks) == 1
    assert not dup.model.layers[0].self_attn._forward_hooks
    with torch.no_grad():
        model(ids)
    assert all(g.enabled for g in fusion_groups(model))


def test_qwen2_biases_fuse():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
    ids = _random_ids((1, 10), seed=2)
    model = swap_in_fp8(base, ids, "fp8-dynamic")
    twin = copy.deepcopy(model)
    rep = fuse_projections(model)
    assert len(rep.fused) == 2 and fusion_groups(model)[0].fused.bias is not None
    assert model.model.layers[0].self_attn.q_proj.bias.data_ptr() == fusion_groups(model)[0].fused.bias.data_ptr()
    with torch.no_grad():
        assert calc_diff(model(ids).logits, twin(ids).logits) < 1e-10


@pytest.mark.slow
def test_fused_smollm2_greedy_tokens_match_unfused(smollm2):
    from transformers.generation.configuration_utils import CompileConfig

    base, tok = smollm2
    model = copy.deepcopy(base)
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
    ids = tok("The three primary colors are", return_tensors="pt").input_ids
    for preset in ("fp8-tensor", "fp8-block"):
        torch._dynamo.reset()
        plain = swap_in_fp8(copy.deepcopy(model), ids, preset, 1.5)
        fused = copy.deepcopy(plain)
        rep = fuse_projections(fused)
        # SmolLM2: q 576 + k 192 + v 192 rows; 576 is not a multiple of 128, so block scales fuse gate/up only
        assert len(rep.fused) == (4 if preset == "fp8-tensor" else 2), rep
        kw = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False)
        cc = CompileConfig(fullgraph=True)
        cc._compile_all_devices = True
        from fp8_linear.backends import emulated

        with torch.inference_mode(), emulated.weight_cache():
            ref = plain.generate(ids, **kw)
            eager = fused.generate(ids, **kw)
            static = fused.generate(ids, cache_implementation="static", compile_config=cc, **kw)
        assert torch.equal(eager, ref), (preset, tok.decode(eager[0]), tok.decode(ref[0]))
        assert torch.equal(static, ref), (preset, tok.decode(static[0]), tok.decode(ref[0]))
    torch._dynamo.reset()


def test_bart_encoder_decoder_fuses_cross_attention_key_value():
    """A real encoder-decoder (Bart): self-attention q/k/v and cross-attention k/v (on the encoder's
    states) fuse; greedy tokens equal the unfused model's."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    cfg = BartConfig(vocab_size=256, d_model=128, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64)
    base = BartForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for p in base.parameters():
            if p.dim() == 2:
                p.mul_(WEIGHT_GAIN)
    ids = _random_ids((2, 10), seed=3)
    model = swap_in_fp8(base, ids, "fp8-dynamic")
    twin = copy.deepcopy(model)
    rep = fuse_projections(model)
    got = sorted((g.parent.split(".")[-1], g.members) for g in rep.fused)
    assert got == [("encoder_attn", ("k_proj", "v_proj")), ("self_attn", QKV), ("self_attn", QKV)], got
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, num_beams=1)
    with torch.inference_mode():
        out, ref = model.generate(ids, **kw), twin.generate(ids, **kw)
    assert torch.equal(out, ref)
    assert all(g.enabled and g._state is None for g in fusion_groups(model))
