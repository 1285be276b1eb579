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


def plot(table: ComparisonTable, folder: str | os.PathLike, stem: str = "comparison") -> dict[str, str]:
    """PNG plots: per-layer SQNR (dB) per scheme, and perplexity (or embedding cosine) per scheme.

    Returns kind -> path; empty if matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out = {}
    if table.layer_sqnr_db:
        fig, ax = plt.subplots(figsize=(10, 4))
        for scheme, layers in table.layer_sqnr_db.items():
            vals = [v if math.isfinite(v) else float("nan") for v in layers.values()]
            ax.plot(range(len(vals)), vals, marker=".", linewidth=1, label=scheme)
        ax.set_xlabel("quantized Linear layer (model order)")
        ax.set_ylabel("SQNR vs unquantized (dB)")
        ax.set_title("Per-layer output SQNR")
        ax.grid(alpha=0.3)
        ax.legend()
        out["sqnr_png"] = os.path.join(folder, f"{stem}_sqnr.png")
        fig.tight_layout()
        fig.savefig(out["sqnr_png"], dpi=120)
        plt.close(fig)
    metric = "perplexity" if any(r.get("perplexity") is not None for r in table.rows) else "embedding_cosine"
    rows = [r for r in table.rows if r.get(metric) is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4))
        names, vals = [r["scheme"] for r in rows], [r[metric] for r in rows]
        ax.bar(names, vals, color=["grey"] + ["tab:blue"] * (len(rows) - 1))
        lo, hi = min(vals), max(vals)
        pad = max((hi - lo) * 0.5, abs(hi) * 1e-4)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_ylabel(COLUMNS[metric][0])
        ax.set_title(f"{COLUMNS[metric][0]} per scheme (first bar: unquantized)")
        for i, v in enumerate(vals):
            ax.annotate(COLUMNS[metric][1].format(v), (i, v), ha="center", va="bottom", fontsize=8)
        out["metric_png"] = os.path.join(folder, f"{stem}_{'ppl' if metric == 'perplexity' else 'cosine'}.png")
        fig.tight_layout()
        fig.savefig(out["metric_png"], dpi=120)
        plt.close(fig)
    return out
