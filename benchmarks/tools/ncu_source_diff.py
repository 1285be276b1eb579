"""Compare two ncu per-SASS-line source-counter exports of the same kernel (for example the per-tensor
and the per-channel launch of one config): total warp-stall samples, the change per stall reason, and
the SASS lines whose samples changed most.

The exports come from
    ncu --section SourceCounters --page source --print-source sass --csv ... > a.csv
(``benchmarks/tools/device_run.sh ncusrc``). Lines are matched by their index in the listing, not by
address: the same SASS loads at a different address in every process, so the addresses differ between
runs even when the instructions are identical. The two listings must have the same length and the same
instruction at every index (addresses inside the text are ignored); otherwise this stops with an error.

Usage: python -m benchmarks.tools.ncu_source_diff a.csv b.csv [--top 25]
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
_ADDRESS = re.compile(r"0x[0-9a-f]{6,}")


@dataclass
class Listing:
    """One export: the header row and the per-SASS-line rows (as strings, in listing order)."""

    header: list[str]
    rows: list[list[str]]

    def column(self, name: str) -> int:
        if name not in self.header:
            raise ValueError(f"column {name!r} not in the export (got {len(self.header)} columns)")
        return self.header.index(name)

    def stall_columns(self) -> list[int]:
        """Indices of the per-reason sample columns (``stall_*``, all samples, not the not-issued ones)."""
        return [i for i, h in enumerate(self.header) if h.startswith("stall_") and "Not Issued" not in h]


def read_listing(path: str) -> Listing:
    """Parse an ncu ``--page source --csv`` export: skip ncu's own log lines and the kernel-name line,
    take the header row (the one with ``Address`` and ``Source``) and every row after it."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows):
        if len(row) > 2 and row[0] == "Address" and row[1] == "Source":
            return Listing(row, [r for r in rows[i + 1:] if len(r) == len(row)])
    raise ValueError(f"{path}: no 'Address','Source' header row (not an ncu --page source --csv export)")


def number(text: str) -> float:
    """ncu's cell text as a number ('' and '-' are 0; thousands separators are dropped)."""
    text = text.replace(",", "").strip()
    return float(text) if text and text != "-" else 0.0


def instruction(row: list[str]) -> str:
    """The SASS text of a row with its absolute addresses blanked (they differ between processes)."""
    return _ADDRESS.sub("ADDR", row[1].strip())


def compare(a: Listing, b: Listing, top: int = 25) -> str:
    """The report as text: totals, per stall reason (a, b, b - a), then the ``top`` lines by |b - a|."""
    if len(a.rows) != len(b.rows):
        raise ValueError(f"different listings: {len(a.rows)} vs {len(b.rows)} SASS lines")
    for i, (ra, rb) in enumerate(zip(a.rows, b.rows)):
        if instruction(ra) != instruction(rb):
            raise ValueError(f"different SASS at line {i}: {instruction(ra)!r} vs {instruction(rb)!r}")
    s, e = a.column(SAMPLES), a.column(EXECUTED)
    ta, tb = (sum(number(r[s]) for r in L.rows) for L in (a, b))
    out = [f"samples: a {ta:.0f}, b {tb:.0f}, b - a {tb - ta:+.0f} ({100 * (tb - ta) / max(ta, 1):+.1f}%)",
           "", f"{'stall reason':<28}{'a':>8}{'b':>8}{'b - a':>8}"]
    for c in a.stall_columns():
        va, vb = sum(number(r[c]) for r in a.rows), sum(number(r[c]) for r in b.rows)
        if va or vb:
            out.append(f"{a.header[c]:<28}{va:8.0f}{vb:8.0f}{vb - va:+8.0f}")
    stalls = a.stall_columns()

    def top_reason(row: list[str]) -> str:
        best = max(stalls, key=lambda c: number(row[c]), default=None)
        return a.header[best][len("stall_"):] if best is not None and number(row[best]) > 0 else "-"

    order = sorted(range(len(a.rows)), key=lambda i: -abs(number(b.rows[i][s]) - number(a.rows[i][s])))[:top]
    out += ["", f"{'line':>5} {'a':>6} {'b':>6} {'b-a':>6} {'exec a':>8} {'exec b':>8}  top stall a / b  SASS"]
    for i in order:
        ra, rb = a.rows[i], b.rows[i]
        out.append(f"{i:5d} {number(ra[s]):6.0f} {number(rb[s]):6.0f} {number(rb[s]) - number(ra[s]):+6.0f} "
                   f"{number(ra[e]):8.0f} {number(rb[e]):8.0f}  {top_reason(ra)} / {top_reason(rb)}  "
                   f"{instruction(ra)[:70]}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--top", type=int, default=25, help="how many lines to list (largest sample change first)")
    args = ap.parse_args(argv)
    try:
        print(compare(read_listing(args.a), read_listing(args.b), args.top))
    except (OSError, ValueError) as err:
        print(f"ncu_source_diff: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
