"""How far the small-M GEMM bars of issue #22 sit from what the card allows, offline (no GPU).

    python -m benchmarks.decode_bound                                  # the committed decode set
    python -m benchmarks.decode_bound benchmarks/results/<decode>.json --copy-tbps 4.3

Reads one decode-set run (``python -m benchmarks.gemm_bench --mode decode --columns ours,cublas_t``: per
layer and M, our time and cuBLASLt's in us, raw kernels in CUDA graphs over operand copies beyond L2).
No single launch can take less than

    t_ideal = floor + bytes / bandwidth

``bytes``      the problem's HBM traffic: the FP8 weight N x K and activation M x K once, the bf16 output M x N.
``bandwidth``  the HBM read rate of a copy on the card (``--copy-tbps``, COPY_TBPS: H200, issue #22's
               measurement); the file's best rate, bytes / t over every cell and column, is printed beside it.
``floor``      the least fixed cost any kernel of the file shows: min over every cell and column of
               t - bytes / bandwidth (launch inside a CUDA graph, prologue, pipeline fill, epilogue).

Per M bucket it prints the geomean of cuBLASLt / t_ideal, the most cuBLASLt / ours any kernel could reach
("best possible"); the fraction of t_ideal that ours and cuBLASLt reach (geomean of t_ideal / t); and what
the bar (BAR_SMALL_M, 1.15) asks: ours at bar / best-possible of t_ideal on every shape, or on the geomean.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib

from benchmarks.common.results import RESULTS_DIR
from benchmarks.common.shapes import gemm_bytes
from benchmarks.common.timing import geomean

#: The decode set of 2026-12-02 16:14 UTC (H200, kernel v39 + the short-K and rule-5 choices): the
#: current row of docs/performance.md "GEMM at small M".
DEFAULT_FILE = RESULTS_DIR / "h200-2026-12-02-decode-set-rule5-shortk.json"
#: TB/s: the H200's HBM copy rate (issue #22: "the copy bandwidth measures ~4.3 TB/s"; the spec sheet's
#: 4.8 is the pin rate).
COPY_TBPS = 4.3
#: Issue #22's bar at M = 1, 16, 64 and 128: geomean cuBLASLt time / ours.
BAR_SMALL_M = 1.15


def bound(rows: list[dict], copy_tbps: float = COPY_TBPS, bar: float = BAR_SMALL_M) -> dict:
    """The ideal-kernel bound of a decode set's ``rows`` (each with ``M``, ``N``, ``K`` and ``us`` holding
    ``ours`` and ``cublas_t``): ``floor_us``, ``best_tbps`` (the fastest cell's bytes / t) and per M (ascending) ``best_possible``
    (geomean cuBLASLt / t_ideal), ``ours_of_ideal`` / ``cublas_of_ideal`` (geomean t_ideal / t),
    ``bar_needs_of_ideal`` (bar / best_possible: the fraction of t_ideal ours must reach on the geomean),
    ``impossible`` (shapes where cuBLASLt / t_ideal < bar: the bar cannot be met on that shape) and ``shapes``."""
    bw = copy_tbps * 1e12 / 1e6  # bytes per us
    cells = [(r, gemm_bytes(r["M"], r["N"], r["K"])) for r in rows if "ours" in r["us"] and "cublas_t" in r["us"]]
    if not cells:
        raise ValueError("decode_bound: no row has both 'ours' and 'cublas_t' timings")
    floor = min(t - b / bw for r, b in cells for t in (r["us"]["ours"], r["us"]["cublas_t"]))
    fastest = max(b / t for r, b in cells for t in (r["us"]["ours"], r["us"]["cublas_t"]))
    by_m: dict[int, list] = collections.defaultdict(list)
    for r, b in cells:
        by_m[r["M"]].append((r, floor + b / bw))
    per_m = {}
    for m in sorted(by_m):
        group = by_m[m]
        best = geomean(r["us"]["cublas_t"] / ideal for r, ideal in group)
        per_m[m] = dict(
            shapes=len(group), best_possible=best,
            ours_of_ideal=geomean(ideal / r["us"]["ours"] for r, ideal in group),
            cublas_of_ideal=geomean(ideal / r["us"]["cublas_t"] for r, ideal in group),
            bar_needs_of_ideal=bar / best,
            impossible=sum(r["us"]["cublas_t"] / ideal < bar for r, ideal in group))
    return dict(floor_us=floor, copy_tbps=copy_tbps, best_tbps=fastest / 1e6, bar=bar, per_m=per_m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=str(DEFAULT_FILE), help="a gemm_bench --mode decode JSON")
    ap.add_argument("--copy-tbps", type=float, default=COPY_TBPS, help="HBM bandwidth of the ideal kernel, TB/s")
    ap.add_argument("--bar", type=float, default=BAR_SMALL_M)
    args = ap.parse_args(argv)
    path = pathlib.Path(args.file)
    if not path.is_file():
        raise SystemExit(f"decode_bound: no such file: {path}")
    doc = json.loads(path.read_text())
    res = bound(doc["rows"], args.copy_tbps, args.bar)
    meta = doc.get("meta", {})
    print(f"{path.name} ({meta.get('gpu')}, {meta.get('date')}): floor {res['floor_us']:.2f} us, bandwidth "
          f"{res['copy_tbps']:.2f} TB/s (the file's fastest cell: {res['best_tbps']:.2f} TB/s)")
    print(f"{'M':>5} {'shapes':>6} {'best possible':>13} {'ours/ideal':>10} {'cuBLASLt/ideal':>14} "
          f"{'bar needs':>9} {'bar out of reach on':>20}")
    for m, p in res["per_m"].items():
        print(f"{m:>5} {p['shapes']:>6} {p['best_possible']:>13.3f} {p['ours_of_ideal']:>10.3f} "
              f"{p['cublas_of_ideal']:>14.3f} {p['bar_needs_of_ideal']:>9.3f} {p['impossible']:>13} shapes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
