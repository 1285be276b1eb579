"""benchmarks/step_profile.py's arithmetic: kernel categories by name, the busy time as the union of
kernel intervals, and one decode step as the difference of two profiled calls."""

from __future__ import annotations

import pytest

from benchmarks import step_profile as sp


@pytest.mark.parametrize("name,want", [
    ("void fp8sm90::fp8_gemm_sm90_kernel<16, true, 4, 0, 0, false, false, false>(CUtensorMap_st)", "fp8 gemm (ours)"),
    ("void fp8act::(anonymous namespace)::quant_rows_kernel<__nv_bfloat16, 0, 0, true>(...)", "act quant (ours)"),
    ("fp8sm90::(anonymous namespace)::splitk_reduce_kernel(float const*, int)", "split-K reduce (ours)"),
    ("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT", "cuBLAS/cuBLASLt gemm"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_14", "inductor triton"),
    ("Memcpy DtoD (Device -> Device)", "copy/fill"),
    ("some_other_kernel", "other"),
])
def test_category(name, want):
    assert sp.category(name) == want


def test_busy_is_the_union_of_intervals():
    assert sp.busy_us([]) == 0.0
    assert sp.busy_us([(0, 2), (1, 3), (5, 6)]) == 4.0  # overlap counted once, the gap not at all
    assert sp.busy_us([(5, 6), (0, 10)]) == 10.0  # contained, any order


def test_per_step_is_the_difference_over_the_extra_steps():
    short = dict(categories={"a": dict(count=10, us=100.0)}, names={"k": 100.0}, busy_us=100.0, span_us=150.0,
                 wall_us=1000.0)
    long = dict(categories={"a": dict(count=30, us=300.0), "b": dict(count=2, us=4.0)}, names={"k": 300.0, "j": 4.0},
                busy_us=304.0, span_us=400.0, wall_us=3000.0)
    r = sp.per_step(short, long, 2)
    assert r["categories"] == {"a": dict(count=10.0, us=100.0), "b": dict(count=1.0, us=2.0)}
    assert (r["busy_us"], r["span_us"], r["idle_us"], r["wall_us"]) == (102.0, 125.0, 23.0, 1000.0)
    assert [t["name"] for t in r["top"]] == ["k", "j"]
