"""The comparison plots: perplexity on an axis from zero plus the change vs the baseline with standard-error
bars; per-layer SQNR grouped by layer type with the worst layers named; eval data and token count in titles."""

from __future__ import annotations

import pytest

from fp8_linear.calibration.report import ComparisonTable, group_layers, layer_type, metric_figure, sqnr_figure, worst_layers

pytest.importorskip("matplotlib")

LLAMA_TYPES = ("q", "k", "v", "o", "gate", "up", "down")


def llama_names(blocks: int) -> list[str]:
    return [f"model.layers.{i}.{'self_attn' if t in 'qkvo' else 'mlp'}.{t}_proj" for i in range(blocks) for t in LLAMA_TYPES]


def table() -> ComparisonTable:
    names = llama_names(3)
    sqnr = {"fp8-tensor": {n: 30.0 + i % 5 for i, n in enumerate(names)},
            "fp8-block": {n: 33.0 + i % 3 for i, n in enumerate(names)}}
    sqnr["fp8-tensor"]["model.layers.2.mlp.down_proj"] = 21.5
    sqnr["fp8-block"]["model.layers.1.self_attn.v_proj"] = 24.0
    rows = [{"scheme": "unquantized-fp32", "perplexity": 10.81, "ppl_delta_pct": 0.0},
            {"scheme": "fp8-tensor", "perplexity": 11.0, "ppl_delta_pct": 1.79, "ppl_delta_se_pct": 0.38},
            {"scheme": "fp8-block", "perplexity": 10.96, "ppl_delta_pct": 1.35, "ppl_delta_se_pct": 0.26}]
    return ComparisonTable(rows=rows, layer_sqnr_db=sqnr,
                           notes={"eval_tokens_or_samples": 8176, "eval_data": "bundled eval split", "model": "smollm2"})


@pytest.mark.parametrize("name, typ", [
    ("model.layers.3.self_attn.q_proj", "q"), ("model.layers.3.mlp.down_proj", "down"),
    ("encoder.layer.0.attention.self.query", "q"), ("encoder.layer.0.attention.output.dense", "o"),
    ("encoder.layer.0.intermediate.dense", "up"), ("encoder.layer.0.output.dense", "down"),
    ("model.layers.0.block_sparse_moe.gate", "gate"), ("transformer.h.0.mlp.experts_fc", "experts_fc"),
])
def test_layer_type(name, typ):
    assert layer_type(name) == typ


def test_groups_follow_the_layer_types_in_block_order():
    g = group_layers(list(reversed(llama_names(4))))
    assert list(g) == list(LLAMA_TYPES)
    assert [i for i, _ in g["down"]] == [0, 1, 2, 3]


def test_worst_layers_are_distinct_and_sorted():
    w = worst_layers(table(), 2)
    assert w == [("model.layers.2.mlp.down_proj", "fp8-tensor", 21.5), ("model.layers.1.self_attn.v_proj", "fp8-block", 24.0)]


def test_sqnr_figure_has_a_panel_per_layer_type_and_names_the_worst():
    import matplotlib.pyplot as plt

    fig = sqnr_figure(table())
    try:
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert titles == [f"{t}_proj" for t in LLAMA_TYPES]
        texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
        assert "model.layers.2.mlp.down_proj" in texts and "21.5 dB" in texts
        title = fig._suptitle.get_text()
        assert "8,176 tokens" in title and "bundled eval split" in title
    finally:
        plt.close(fig)


def test_perplexity_figure_from_zero_with_error_bars():
    import matplotlib.pyplot as plt

    fig = metric_figure(table())
    try:
        from matplotlib.container import BarContainer

        a0, a1 = fig.axes
        assert a0.get_ylim()[0] == 0 and a0.get_ylim()[1] > 11.0
        bars = next(c for c in a1.containers if isinstance(c, BarContainer))
        assert [round(r.get_height(), 2) for r in bars.patches] == [1.79, 1.35]
        _, _, (stems,) = bars.errorbar.lines  # one vertical line per bar: delta +- SE
        assert [[round(y, 2) for y in seg[:, 1]] for seg in stems.get_segments()] == [[1.41, 2.17], [1.09, 1.61]]
        assert a1.get_ylim()[0] <= 0 and a1.get_ylim()[1] > 1.79 + 0.38
        assert "8,176 tokens" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_encoder_figure_plots_distance_from_one():
    import matplotlib.pyplot as plt

    t = ComparisonTable(rows=[{"scheme": "unquantized-fp32", "embedding_cosine": 1.0},
                              {"scheme": "fp8-tensor", "embedding_cosine": 0.9995}], notes={"eval_tokens_or_samples": 64})
    fig = metric_figure(t)
    try:
        ax = fig.axes[0]
        assert ax.get_ylim()[0] == 0 and "64 sentences" in ax.get_title()
    finally:
        plt.close(fig)
