"""``benchmarks.moe_call_overhead`` on the CPU: what one call of the compiled MoE decode step carries besides its
graph (inputs, guards, replayed stores), BF16 against FP8 experts."""

from __future__ import annotations

import pytest

from benchmarks.moe_call_overhead import PATHS, measure


def test_fp8_experts_add_only_their_scales_to_the_compiled_call():
    """One layer: the FP8 experts (dynamic activations) pass their two weight scales as graph inputs beyond
    BF16's two expert weights, add no attribute store replayed after the graph, and no more guards naming the
    experts module than BF16's experts module has (its bool / string attributes replace BF16's flags)."""
    bf16 = measure("bf16", 1, 3)
    fp8 = measure("fp8-dynamic+experts", 1, 3)
    assert (bf16["expert_inputs"], fp8["expert_inputs"]) == (2, 4)
    assert fp8["graph_inputs"] - bf16["graph_inputs"] == 2
    assert fp8["stores"] == bf16["stores"]
    assert fp8["expert_guards"] <= bf16["expert_guards"], (fp8, bf16)
    # module-alias checks (`a.torch is b.torch`, once per model for each module dynamo reads torch through): our
    # modules add a few; BF16 checks its experts' `config` in Python once per layer, the FP8 experts never
    assert fp8["lambda_guards"] <= bf16["lambda_guards"] + 2
    assert fp8["us_per_call"] > 0 and fp8["recompiles"] >= 1


def test_paths_are_checked():
    assert "fp8-block+experts" in PATHS
    with pytest.raises(SystemExit):
        from benchmarks.moe_call_overhead import main

        main(["--paths", "bf16,fp8-nope"])
