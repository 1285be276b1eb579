"""The benchmark shape sets (benchmarks/common/shapes.py): sizes, the models' real dimensions, parsing."""

from __future__ import annotations

import pytest

from benchmarks.common import shapes as S


def test_design_set_is_docs_section_7():
    design = S.design_set()
    # 70B o at M = 8192 is 8192^3, which the set also lists as "square": 67 distinct shapes
    assert len(design) == 68 and len(set(s.mnk for s in design)) == 67
    assert [s.mnk for s in design].count((8192, 8192, 8192)) == 2
    assert {s.m for s in design} == set(S.DESIGN_MS) | {1024, 6144, 8192}
    assert len(S.judged_set()) == 27 and all(s.m >= S.LARGE_M for s in S.judged_set())
    assert (8192, 8192, 8192) in {s.mnk for s in S.judged_set()}


def test_decode_models_give_their_published_layer_shapes():
    by_name = {d.name: dict((layer.split()[-1], (n, k)) for layer, n, k in d.linear_nk()) for d in S.DECODE_MODELS}
    # Llama-3.1 8B / 70B are the design set's layers
    for size, model in (("8B", "Llama-3.1-8B"), ("70B", "Llama-3.1-70B")):
        design = {layer.split()[-1]: (n, k) for layer, n, k in S.LLAMA_NK if layer.startswith(size + " ")}
        assert by_name[model] == design
    # head_dim differs from hidden / heads here: Gemma-2-9B (256 x 16 heads = 4096 > 3584), Llama-3.2-1B (64)
    assert by_name["Gemma-2-9B"] == {"qkv": (8192, 3584), "o": (3584, 4096), "gate_up": (28672, 3584),
                                     "down": (3584, 14336)}
    assert by_name["Llama-3.2-1B"]["qkv"] == (3072, 2048)
    assert by_name["Qwen2.5-0.5B"] == {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}


def test_decode_set_covers_every_model_at_every_m():
    shapes = S.decode_set()
    assert S.DECODE_MS == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    nks = {(s.n, s.k) for s in shapes}
    every = {(n, k) for d in S.DECODE_MODELS for _, n, k in d.linear_nk()}
    assert nks == every  # shared weight shapes (Qwen2.5-14B / 32B attention) kept once
    assert len(shapes) == len(every) * len(S.DECODE_MS) and len(set(s.mnk for s in shapes)) == len(shapes)
    # every K suits the kernel (K % 16 == 0) and every layer has a model name
    assert all(s.k % 16 == 0 for s in shapes) and all(s.layer.split()[0] in {d.name for d in S.DECODE_MODELS} for s in shapes)


def test_quick_sets_are_subsets():
    assert set(S.named_set("decode", quick=True)) <= set(S.decode_set())
    assert set(S.named_set("judged", quick=True)) <= set(S.judged_set())
    assert len(S.named_set("decode", quick=True)) < 60


@pytest.mark.parametrize("bad", ["nope", ""])
def test_unknown_set_is_refused(bad):
    with pytest.raises(ValueError, match="unknown"):
        S.named_set(bad)


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="Llama-9"):
        S.decode_set(models=("Llama-9",))


def test_parse_shapes_reads_mxnxk_lists():
    got = S.parse_shapes("6144x6144x1280, 8192X4096x4096")
    assert [s.mnk for s in got] == [(6144, 6144, 1280), (8192, 4096, 4096)]


@pytest.mark.parametrize("bad", ["1x2", "0x8x16", "axbxc", "8x8x-16", "8x8x16,"])
def test_parse_shapes_rejects_malformed(bad):
    with pytest.raises(ValueError, match="MxNxK"):
        S.parse_shapes(bad)


def test_parse_ints():
    assert S.parse_ints("1, 16,64", "--ms") == [1, 16, 64] and S.parse_ints("", "--ms") == []
    with pytest.raises(ValueError, match="--ms"):
        S.parse_ints("1,x", "--ms")


def test_gemm_bytes_counts_operands_and_output_once():
    assert S.gemm_bytes(1, 4096, 4096) == 4096 + 4096 * 4096 + 2 * 4096
