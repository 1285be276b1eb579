"""The comparison table of ``compare_schemes``: printed, saved as Markdown, CSV and JSON, and plotted.

One row per model (the unquantized baseline first, then one per scheme), one column per metric
(:data:`COLUMNS`); a metric that does not apply (e.g. perplexity of an encoder) is empty.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field

#: Column name -> (header, format) of the table; the order is the table's.
COLUMNS: dict[str, tuple[str, str]] = {
    "scheme": ("scheme", "{}"),
    "perplexity": ("ppl", "{:.4f}"),
    "ppl_delta_pct": ("ppl vs base %", "{:+.3f}"),
    # standard error of that column over the eval windows (paired with the baseline, same windows)
    "ppl_delta_se_pct": ("+- SE %", "{:.3f}"),
    "top1_agreement": ("top-1 agree", "{:.4f}"),
    "kl": ("KL (nats/token)", "{:.5f}"),
    "embedding_cosine": ("emb. cosine", "{:.6f}"),
    "mean_sqnr_db": ("mean SQNR dB", "{:.2f}"),
    "min_sqnr_db": ("min SQNR dB", "{:.2f}"),
    "checkpoint_mb": ("checkpoint MB", "{:.1f}"),
    "quantize_s": ("quantize s", "{:.1f}"),
}


@dataclass
class ComparisonTable:
    """Rows of metrics (dicts keyed by :data:`COLUMNS`), per-layer SQNR per scheme, and run notes."""

    rows: list[dict] = field(default_factory=list)
    layer_sqnr_db: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: dict = field(default_factory=dict)

    def columns(self) -> list[str]:
        """The columns that hold a value in at least one row, in :data:`COLUMNS` order."""
        return [c for c in COLUMNS if any(r.get(c) is not None for r in self.rows)]

    def row(self, scheme: str) -> dict:
        """The row of ``scheme`` (``KeyError`` naming the known ones otherwise)."""
        for r in self.rows:
            if r["scheme"] == scheme:
                return r
        raise KeyError(f"scheme: expected one of {[r['scheme'] for r in self.rows]}, got {scheme!r}")

    def _cells(self, row: dict) -> list[str]:
        out = []
        for c in self.columns():
            v = row.get(c)
            out.append("" if v is None else (COLUMNS[c][1].format(v) if not isinstance(v, float) or math.isfinite(v) else str(v)))
        return out

    def to_markdown(self) -> str:
        """A GitHub Markdown table."""
        head = [COLUMNS[c][0] for c in self.columns()]
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(self._cells(r)) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        head = [COLUMNS[c][0] for c in self.columns()]
        body = [self._cells(r) for r in self.rows]
        w = [max(len(x) for x in col) for col in zip(head, *body)]
        fmt = lambda cells: "  ".join(x.ljust(n) if i == 0 else x.rjust(n) for i, (x, n) in enumerate(zip(cells, w)))  # noqa: E731
        return "\n".join([fmt(head), "  ".join("-" * n for n in w)] + [fmt(b) for b in body])

    def to_dict(self) -> dict:
        """JSON-ready: ``{"rows": [...], "layer_sqnr_db": {scheme: {layer: dB}}, "notes": {...}}``."""
        clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
        return {
            "rows": [{k: clean(v) for k, v in r.items()} for r in self.rows],
            "layer_sqnr_db": {s: {k: clean(v) for k, v in d.items()} for s, d in self.layer_sqnr_db.items()},
            "notes": self.notes,
        }

    def save(self, folder: str | os.PathLike, stem: str = "comparison", plots: bool = True) -> dict[str, str]:
        """Write ``<stem>.md``, ``.csv``, ``.json`` (and ``<stem>_sqnr.png``, ``<stem>_ppl.png`` when
        ``plots`` and matplotlib is installed) into ``folder``; returns kind -> path."""
        os.makedirs(folder, exist_ok=True)
        paths = {k: os.path.join(folder, f"{stem}.{k}") for k in ("md", "csv", "json")}
        with open(paths["md"], "w") as f:
            f.write(self.to_markdown())
        with open(paths["csv"], "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=self.columns(), extrasaction="ignore")
            wr.writeheader()
            wr.writerows(self.rows)
        with open(paths["json"], "w") as f:
            json.dump(self.to_dict(), f, indent=2)
        if plots:
            paths.update(plot(self, folder, stem))
        return paths


#: Layer types in the order the SQNR plot shows them (Llama / Qwen names; BERT names map onto them).
LAYER_TYPES = ("q", "k", "v", "o", "gate", "up", "down")
#: Module name endings of other architectures -> layer type.
LAYER_TYPE_ALIASES = {"query": "q", "key": "k", "value": "v", "attention.output.dense": "o", "intermediate.dense": "up",
                      "output.dense": "down", "c_attn": "q", "c_proj": "o", "c_fc": "up", "dense": "o", "fc1": "up", "fc2": "down"}
#: Worst (lowest-SQNR) layers named on the SQNR plot.
WORST_LABELLED = 3
BASELINE_COLOR, SCHEME_COLOR = "grey", "tab:blue"


def layer_type(name: str) -> str:
    """The type of a Linear layer from its qualified name: ``model.layers.3.self_attn.q_proj`` -> ``q``,
    ``...mlp.down_proj`` -> ``down``, BERT's ``...attention.self.query`` -> ``q``; else its last name part."""
    parts = name.split(".")
    last = parts[-1][:-5] if parts[-1].endswith("_proj") else parts[-1]
    if last in LAYER_TYPES:
        return last
    for n in (3, 2, 1):  # the longest alias that ends the name wins (attention.output.dense before dense)
        tail = ".".join(parts[-n:])
        if tail in LAYER_TYPE_ALIASES:
            return LAYER_TYPE_ALIASES[tail]
    return last


def layer_index(name: str) -> int | None:
    """The block number in a qualified name (``model.layers.12.mlp.up_proj`` -> 12), or None."""
    return next((int(p) for p in name.split(".") if p.isdigit()), None)


def group_layers(names) -> dict[str, list[tuple[int, str]]]:
    """``{layer type: [(block index, name), ...]}`` in :data:`LAYER_TYPES` order (other types after, sorted);
    names without a block number get their position among their type."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for n in names:
        g = groups.setdefault(layer_type(n), [])
        idx = layer_index(n)
        g.append((len(g) if idx is None else idx, n))
    order = [t for t in LAYER_TYPES if t in groups] + sorted(t for t in groups if t not in LAYER_TYPES)
    return {t: sorted(groups[t]) for t in order}


def _eval_caption(table: ComparisonTable) -> str:
    n = table.notes
    unit = "tokens" if any(r.get("perplexity") is not None for r in table.rows) else "sentences"
    parts = [n.get("model"), f"eval data: {n['eval_data']}" if n.get("eval_data") else None,
             f"{n['eval_tokens_or_samples']:,} {unit}" if n.get("eval_tokens_or_samples") else None]
    return ", ".join(p for p in parts if p)


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def worst_layers(table: ComparisonTable, n: int = WORST_LABELLED) -> list[tuple[str, str, float]]:
    """The ``n`` distinct layers with the lowest SQNR of any scheme: ``[(layer, scheme, dB), ...]``, worst first."""
    best: dict[str, tuple[float, str]] = {}
    for sch, d in table.layer_sqnr_db.items():
        for name, v in d.items():
            if math.isfinite(v) and (name not in best or v < best[name][0]):
                best[name] = (v, sch)
    return [(name, sch, v) for name, (v, sch) in sorted(best.items(), key=lambda kv: kv[1][0])[:n]]


def sqnr_figure(table: ComparisonTable):
    """Per-layer output SQNR (dB) against the unquantized layer: one panel per layer type (q, k, v, o, gate,
    up, down), block index on x, one line per scheme; the :data:`WORST_LABELLED` worst layers circled and
    named in the last panel. Returns a matplotlib Figure (None without matplotlib or per-layer data)."""
    plt = _plt()
    if plt is None or not table.layer_sqnr_db:
        return None
    names = list(dict.fromkeys(n for d in table.layer_sqnr_db.values() for n in d))
    groups = group_layers(names)
    ncols = min(4, len(groups) + 1)
    nrows = -(-(len(groups) + 1) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 2.9 * nrows + 0.8), sharey=True, squeeze=False)
    flat = list(axes.flat)
    worst = worst_layers(table)
    for ax, (typ, members) in zip(flat, groups.items()):
        for sch, d in table.layer_sqnr_db.items():
            pts = [(i, d[n]) for i, n in members if n in d and math.isfinite(d[n])]
            if pts:
                ax.plot(*zip(*pts), marker=".", markersize=4, linewidth=1, label=sch)
        for rank, (n, sch, v) in enumerate(worst, start=1):
            if layer_type(n) == typ:
                x = next(i for i, m in members if m == n)
                ax.plot([x], [v], "o", markersize=9, markerfacecolor="none", markeredgecolor="darkred")
                ax.annotate(str(rank), (x, v), textcoords="offset points", xytext=(7, -9), fontsize=8, color="darkred")
        ax.set_title(f"{typ}_proj" if typ in LAYER_TYPES else typ, fontsize=9)
        ax.set_xlabel("block (layer index)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("SQNR vs unquantized (dB)", fontsize=8)
    key = flat[len(groups)]
    handles, labels = flat[0].get_legend_handles_labels()
    key.legend(handles, labels, loc="upper left", fontsize=8, frameon=False)
    key.text(0.0, 0.42, "worst layers (circled):\n" + "\n".join(f"{r}. {n} ({sch}, {v:.1f} dB)" for r, (n, sch, v) in
                                                                enumerate(worst, start=1)),
             transform=key.transAxes, fontsize=7, va="top", family="monospace")
    key.axis("off")
    for ax in flat[len(groups) + 1:]:
        ax.axis("off")
    cap = _eval_caption(table)
    fig.suptitle("Per-layer output SQNR by layer type, first eval batch" + (f"\n{cap}" if cap else ""), fontsize=10)
    fig.tight_layout()
    return fig


def metric_figure(table: ComparisonTable):
    """Causal LMs: perplexity per model on a y axis from zero (left) and the change against the baseline in
    % with +-1 standard error bars (right; paired over the eval windows, so a bar that crosses another's
    error bar is no ranking). Encoders: embedding cosine per scheme. Returns a Figure or None."""
    plt = _plt()
    if plt is None:
        return None
    cap = _eval_caption(table)
    if any(r.get("perplexity") is not None for r in table.rows):
        rows = [r for r in table.rows if r.get("perplexity") is not None]
        names = [r["scheme"] for r in rows]
        colors = [BASELINE_COLOR] + [SCHEME_COLOR] * (len(rows) - 1)
        fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.2]})
        vals = [r["perplexity"] for r in rows]
        a0.bar(names, vals, color=colors)
        a0.set_ylim(0, max(vals) * 1.15)
        a0.set_ylabel("perplexity")
        a0.set_title("perplexity (axis from zero)", fontsize=9)
        for i, v in enumerate(vals):
            a0.annotate(f"{v:.3f}", (i, v), ha="center", va="bottom", fontsize=8)
        q = [r for r in rows[1:] if r.get("ppl_delta_pct") is not None]
        d = [r["ppl_delta_pct"] for r in q]
        se = [r.get("ppl_delta_se_pct") or 0.0 for r in q]
        a1.bar([r["scheme"] for r in q], d, yerr=se, capsize=5, color=SCHEME_COLOR, ecolor="black")
        a1.axhline(0, color=BASELINE_COLOR, linewidth=1)
        a1.set_ylim(min(0.0, min((x - e for x, e in zip(d, se)), default=0)) * 1.2,
                    max((x + e for x, e in zip(d, se)), default=1) * 1.25)
        a1.set_ylabel("perplexity vs unquantized (%)")
        a1.set_title("change vs unquantized, \u00b11 standard error (paired over windows)", fontsize=9)
        for i, (x, e) in enumerate(zip(d, se)):
            a1.annotate(f"{x:+.2f}% \u00b1 {e:.2f}", (i, x + e), ha="center", va="bottom", fontsize=8)
        for ax in (a0, a1):
            ax.tick_params(axis="x", labelsize=8, rotation=15)
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle("Perplexity per scheme" + (f" ({cap})" if cap else ""), fontsize=10)
    else:
        rows = [r for r in table.rows if r.get("embedding_cosine") is not None]
        if not rows:
            return None
        fig, ax = plt.subplots(figsize=(7, 4))
        vals = [1.0 - r["embedding_cosine"] for r in rows[1:]]
        ax.bar([r["scheme"] for r in rows[1:]], vals, color=SCHEME_COLOR)
        ax.set_ylim(0, max(vals, default=1e-6) * 1.25 or 1e-6)
        ax.set_ylabel("1 - embedding cosine vs unquantized")
        for i, v in enumerate(vals):
            ax.annotate(f"{v:.2e}", (i, v), ha="center", va="bottom", fontsize=8)
        ax.set_title("Embedding distance per scheme" + (f"\n{cap}" if cap else ""), fontsize=10)
    fig.tight_layout()
    return fig


def plot(table: ComparisonTable, folder: str | os.PathLike, stem: str = "comparison") -> dict[str, str]:
    """PNG plots: per-layer SQNR by layer type (``<stem>_sqnr.png``) and perplexity with its standard error
    (``<stem>_ppl.png``; encoders: ``<stem>_cosine.png``). Returns kind -> path; empty without matplotlib."""
    plt = _plt()
    if plt is None:
        return {}
    out = {}
    ppl = any(r.get("perplexity") is not None for r in table.rows)
    for kind, fig, name in (("sqnr_png", sqnr_figure(table), "sqnr"),
                            ("metric_png", metric_figure(table), "ppl" if ppl else "cosine")):
        if fig is None:
            continue
        out[kind] = os.path.join(folder, f"{stem}_{name}.png")
        fig.savefig(out[kind], dpi=120)
        plt.close(fig)
    return out
