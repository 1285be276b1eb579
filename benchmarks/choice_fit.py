"""A fitted latency model of the sm90 GEMM's configs against the choice rules, offline (issue #22).

    python -m benchmarks.choice_fit                    # tables on stdout
    python -m benchmarks.choice_fit --json /tmp/fit.json

No GPU: it reads the H200 decode measurements committed in ``benchmarks/results`` (RESULT_FILES: raw
kernels in CUDA graphs over operand copies beyond L2, bf16 out, per-tensor scales), builds a table of
(config id, split factor, M, N, K) -> measured us for every config id that ``fp8_linear/kernels/configs.py`` still
has (removed configs, e.g. 3 = swap128x64_4acc, are skipped), fits one latency model per config on the
cells of TRAIN models and judges it on the cells of HELDOUT_MODELS and on the shapes of the held-out file
(none of them is a layer of a training model).

The model, per config (``predict``; parameters positive, fitted on log time, Levenberg-Marquardt)::

    t = a + smax(waves * kb * (b + h * u) + g * waves, bytes / bw) + e * [splits > 1]

``a``      us: launch, prologue and the last tile's epilogue drain, paid once.
``b``      us per k-block on one SM's critical path: max of the tile's wgmma work on one k-block and its
           operand ingest per SM (bytes of one k-block's stage / per-SM ingest rate = bytes in flight /
           latency), the part fixed by the tile (its weight rows, the padded wgmma).
``h``      us per k-block more when the tile's token side is full: ``u`` = M / (token rows of the tile
           blocks covering M), the fraction of the token rows TMA really loads (it zero-fills the rest
           without reading memory) and the epilogue stores.
``g``      us per wave: each tile's epilogue (its output store) and pipeline refill.
``waves``  ceil(tiles x splits / SMS): the persistent grid's wave quantization; ``kb`` = k-blocks of one
           work item (ceil(ceil(K / 128) / splits)).
``bytes``  the HBM bytes of the problem (FP8 weight N x K and activation M x K once, bf16 output), ``bw``
           the bandwidth the config reaches when the grid covers the SMs: with many CTAs the problem is
           HBM-bound, with few the critical path is.
``smax``   a smooth maximum, (x^P + y^P)^(1/P) with P = SMOOTH_MAX_P: the two bounds overlap.
``e``      us: split K's fp32 partials round trip and fix-up (configs with split instances only).

Measurements of one (config, splits, cell) in several files are averaged by the median, with the files
of 2026-12-02 (kernel v39) preferred to the v30 sweep of 2026-12-01 (whose split timings, taken with the
separate reduction kernel before v33, are not used at all). The rules' choice of a cell is what
``fp8_linear/kernels/configs.py`` gives today (``select_config(swap_ok=True)``, ``select_splits``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections import defaultdict

import numpy as np

from benchmarks.common.results import RESULTS_DIR
from benchmarks.common.timing import geomean
from fp8_linear.kernels import configs as C

RESULTS = RESULTS_DIR
#: (file, preference: 0 = kernel v39 files of 2026-12-02, 1 = the v30 sweep), the measured basis.
RESULT_FILES: tuple[tuple[str, int], ...] = (
    ("h200-2026-12-02-v39-decode-set.json", 0),
    ("h200-2026-12-02-decode-config-oracle-m64-256.json", 0),
    ("h200-2026-12-02-v39-config20-decode.json", 0),
    ("h200-2026-12-02-v39-heldout-m128-512.json", 0),
    ("h200-2026-12-01-v30-config-split-sweep.json", 1),
)
#: The file of shapes outside the decode set (all held out).
HELDOUT_FILE = "h200-2026-12-02-v39-heldout-m128-512.json"
#: Files whose forced configs (``cfg<name>``) ran unsplit (splitk mode); elsewhere a forced config runs
#: with its own select_splits factor.
UNSPLIT_FORCED = ("h200-2026-12-01-v30-config-split-sweep.json",)
#: The v30 sweep's split columns (``s2`` ...) used the separate reduction kernel (before v33): skipped.
PRE_V33_SPLITS = ("h200-2026-12-01-v30-config-split-sweep.json",)
#: Models of the decode set held out of the fit (one small, one mid-size, one large).
HELDOUT_MODELS = ("Llama-3.2-3B", "Gemma-2-9B", "Qwen2.5-32B")
#: H200 SMs (the measured card's multiprocessor count).
SMS = 132
#: The exponent of the smooth maximum between the critical-path and the HBM bound.
SMOOTH_MAX_P = 4.0
#: A config is fitted only with at least this many training cells (else it is left out of the model).
MIN_TRAIN_CELLS = 8
#: Initial parameters: a (us), b and h (us / k-block), g (us / wave), bw (bytes / us), e (us).
INIT = {"a": 3.0, "b": 0.1, "h": 0.05, "g": 0.5, "bw": 3.0e6, "e": 1.0}
PARAMS = ("a", "b", "h", "g", "bw", "e")
#: Bound of the log parameters in the fit (keeps exp finite on trial steps).
LOG_PARAM_BOUND = 40.0


def model_of(layer: str) -> str | None:
    """The model of a decode-set layer name (``"Llama-3.1-8B qkv"`` -> ``"Llama-3.1-8B"``); None for a
    bare shape label of the held-out file (``"128x4096x2304"``)."""
    head, _, tail = layer.rpartition(" ")
    return head or None


def _parse_choice(label: str) -> tuple[int, int] | None:
    """``(config id, splits)`` of a result row's ``config`` label (``"tile128x128_2acc split2"``); None for
    a config that no longer exists."""
    name, _, split = label.partition(" split")
    cfg = next((c for c in C.CONFIGS if c.name == name), None)
    return None if cfg is None else (cfg.id, int(split) if split else 1)


def load(results: pathlib.Path = RESULTS) -> dict:
    """The measurement table: ``{(layer, M, N, K): {"cublas": [us...], "meas": {(cfg id, splits): {pref:
    [us...]}}, "heldout_file": bool}}`` over RESULT_FILES."""
    cells: dict = {}
    by_name = {c.name: c for c in C.CONFIGS}
    for fname, pref in RESULT_FILES:
        rows = json.loads((results / fname).read_text())["rows"]
        for r in rows:
            m, n, k = r["M"], r["N"], r["K"]
            key = (r["layer"], m, n, k)
            cell = cells.setdefault(key, {"cublas": [], "meas": defaultdict(lambda: defaultdict(list)),
                                          "heldout_file": fname == HELDOUT_FILE})
            us = r["us"]
            if "cublas_t" in us:
                cell["cublas"].append(us["cublas_t"])
            choice = _parse_choice(r["config"])
            if choice is not None and "ours" in us and not (fname in PRE_V33_SPLITS and choice[1] > 1):
                cell["meas"][choice][pref].append(us["ours"])
            for col, t in us.items():
                if col.startswith("cfg") and not col.endswith("_ch") and col[3:] in by_name:
                    cfg = by_name[col[3:]]
                    s = 1 if fname in UNSPLIT_FORCED else C.select_splits(cfg, m, n, k, SMS)
                    cell["meas"][(cfg.id, s)][pref].append(t)
                elif col == "s1" and choice is not None:
                    cell["meas"][(choice[0], 1)][pref].append(t)
    out = {}
    for key, cell in cells.items():
        meas = {}
        for cs, per in cell["meas"].items():
            best = per[min(per)]  # the preferred files' measurements only
            meas[cs] = float(np.median(best))
        out[key] = {"cublas": float(np.median(cell["cublas"])) if cell["cublas"] else None, "meas": meas,
                    "heldout_file": cell["heldout_file"]}
    return out


def features(cid: int, splits: int, m: int, n: int, k: int) -> tuple[float, float, float, float, float]:
    """``(waves, k-blocks per work item, HBM bytes, split flag, token rows used u)`` of one launch (see the
    module docstring)."""
    cfg = C.CONFIG_BY_ID[cid]
    num_kb = -(-k // C.BLOCK_K)
    s = C.split_count(num_kb, splits)
    waves = -(-C.tiles(cfg, m, n) * s // SMS)
    kb = -(-num_kb // s)
    nbytes = n * k + m * k + 2 * m * n
    tok = cfg.block_n if cfg.swap_ab else cfg.block_m
    used = m / (-(-m // tok) * tok)
    return float(waves), float(kb), float(nbytes), float(s > 1), used


def predict(theta: dict, feats: np.ndarray) -> np.ndarray:
    """Model time (us) for rows ``[waves, kb, bytes, split, u]`` under parameters ``theta`` (PARAMS)."""
    waves, kb, nbytes, split, used = feats.T
    path = waves * kb * (theta["b"] + theta["h"] * used) + theta["g"] * waves
    hbm = nbytes / theta["bw"]
    p = SMOOTH_MAX_P
    return theta["a"] + (path ** p + hbm ** p) ** (1.0 / p) + theta["e"] * split


def _fit_one(feats: np.ndarray, t: np.ndarray, iters: int = 200) -> dict:
    """Levenberg-Marquardt on log time over log parameters (positive), numerical Jacobian; deterministic."""
    names = [p for p in PARAMS if p != "e" or feats[:, 3].any()]
    x = np.log([INIT[p] for p in names])

    def theta_of(v):
        th = dict(zip(names, np.exp(np.clip(v, -LOG_PARAM_BOUND, LOG_PARAM_BOUND))))
        th.setdefault("e", 0.0)
        return th

    def resid(v):
        return np.log(predict(theta_of(v), feats)) - np.log(t)

    lam, r = 1e-2, resid(x)
    for _ in range(iters):
        jac = np.empty((len(t), len(x)))
        for i in range(len(x)):
            dx = np.zeros_like(x)
            dx[i] = 1e-6
            jac[:, i] = (resid(x + dx) - r) / 1e-6
        jtj, jtr = jac.T @ jac, jac.T @ r
        step = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-12), -jtr)
        r_new = resid(x + step)
        if r_new @ r_new < r @ r:
            x, r, lam = x + step, r_new, lam / 3
            if np.abs(step).max() < 1e-9:
                break
        else:
            lam *= 4
    return theta_of(x)


def is_heldout(key) -> bool:
    """Whether a cell is held out of the fit: a layer of HELDOUT_MODELS or a shape of the held-out file."""
    model = model_of(key[0])
    return model is None or model in HELDOUT_MODELS


def rules_choice(m: int, n: int, k: int) -> tuple[int, int]:
    """Today's rules for a per-tensor, bf16-out launch: ``(config id, splits)``."""
    cfg = C.select_config(m, n, k, SMS, swap_ok=True)
    return cfg.id, C.select_splits(cfg, m, n, k, SMS)


def _rel_err_stats(errs: list[float]) -> dict:
    a = np.abs(np.asarray(errs))
    return {"cells": int(a.size), "median": float(np.median(a)) if a.size else None,
            "p90": float(np.percentile(a, 90)) if a.size else None}


def run(results: pathlib.Path = RESULTS) -> dict:
    """The fit and its judgement (what ``--json`` writes): parameters per config, prediction error on
    training and held-out cells, per M the geomean cuBLASLt / ours of the model's argmin, the rules and the
    oracle on held-out cells with the rules' choice and at least one other candidate measured, and the
    cells where the model's pick differs from the rules'."""
    table = load(results)
    for key in table:  # the held-out split is by model: no training model's layer among held-out cells
        if is_heldout(key) and model_of(key[0]) is not None and model_of(key[0]) not in HELDOUT_MODELS:
            raise RuntimeError(f"held-out cell of a training model: {key}")
    per_cfg: dict[int, list] = defaultdict(list)
    for key, cell in table.items():
        if is_heldout(key):
            continue
        _, m, n, k = key
        for (cid, s), t in cell["meas"].items():
            per_cfg[cid].append((features(cid, s, m, n, k), t))
    params, train_err = {}, {}
    for cid in sorted(per_cfg):
        rows = per_cfg[cid]
        if len(rows) < MIN_TRAIN_CELLS:
            continue
        feats = np.array([f for f, _ in rows])
        t = np.array([x for _, x in rows])
        params[cid] = _fit_one(feats, t)
        train_err[cid] = list(predict(params[cid], feats) / t - 1)

    def pred(cid, s, m, n, k):
        return float(predict(params[cid], np.array([features(cid, s, m, n, k)]))[0])

    held_err: dict[int, list] = defaultdict(list)
    buckets: dict[int, dict] = defaultdict(lambda: {"model": [], "rules": [], "oracle": [], "cands": []})
    changed, skipped = [], defaultdict(int)
    for key in sorted(table, key=lambda x: (x[1], x[0])):
        if not is_heldout(key):
            continue
        layer, m, n, k = key
        cell = table[key]
        for (cid, s), t in cell["meas"].items():
            if cid in params:
                held_err[cid].append(pred(cid, s, m, n, k) / t - 1)
        cands = {cs: t for cs, t in cell["meas"].items() if cs[0] in params}
        rule = rules_choice(m, n, k)
        if cell["cublas"] is None or rule not in cands or len(cands) < 2:
            skipped[m] += 1
            continue
        pick = min(cands, key=lambda cs: (pred(cs[0], cs[1], m, n, k), cs))
        oracle = min(cands, key=lambda cs: (cands[cs], cs))
        b = buckets[m]
        b["model"].append(cell["cublas"] / cands[pick])
        b["rules"].append(cell["cublas"] / cands[rule])
        b["oracle"].append(cell["cublas"] / cands[oracle])
        b["cands"].append(len(cands))
        if pick != rule:
            changed.append({"layer": layer, "M": m, "N": n, "K": k, "rules": list(rule), "model": list(pick),
                            "us_rules": cands[rule], "us_model": cands[pick],
                            "pred_rules": pred(*rule, m, n, k), "pred_model": pred(*pick, m, n, k),
                            "oracle": list(oracle), "us_oracle": cands[oracle]})
    choice = {m: {"cells": len(b["model"]), "mean_candidates": float(np.mean(b["cands"])),
                  "model": geomean(b["model"]), "rules": geomean(b["rules"]), "oracle": geomean(b["oracle"])}
              for m, b in sorted(buckets.items())}
    all_m = [x for b in buckets.values() for x in b["model"]]
    all_r = [x for b in buckets.values() for x in b["rules"]]
    all_o = [x for b in buckets.values() for x in b["oracle"]]
    return {
        "heldout_models": list(HELDOUT_MODELS), "heldout_file": HELDOUT_FILE, "sms": SMS,
        "smooth_max_p": SMOOTH_MAX_P,
        "skipped_configs": sorted(c for c in per_cfg if c not in params),
        "params": {str(c): {p: float(v) for p, v in th.items()} for c, th in params.items()},
        "train_cells": {str(c): len(v) for c, v in train_err.items()},
        "train_error": {str(c): _rel_err_stats(v) for c, v in train_err.items()},
        "train_error_all": _rel_err_stats([x for v in train_err.values() for x in v]),
        "heldout_error": {str(c): _rel_err_stats(v) for c, v in sorted(held_err.items())},
        "heldout_error_all": _rel_err_stats([x for v in held_err.values() for x in v]),
        "choice": {str(m): v for m, v in choice.items()},
        "choice_all": {"cells": len(all_m), "model": geomean(all_m), "rules": geomean(all_r),
                       "oracle": geomean(all_o)},
        "choice_skipped_cells": {str(m): v for m, v in sorted(skipped.items())},
        "changed": changed,
    }


def _name(cs) -> str:
    cid, s = cs
    return f"{cid}" + (f"/s{s}" if s > 1 else "")


def print_tables(res: dict, out=None) -> None:
    """The fit's tables in Markdown, to ``out`` (default stdout)."""
    out = sys.stdout if out is None else out
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"Held out: models {', '.join(res['heldout_models'])} and {res['heldout_file']}; SMs {res['sms']}")
    p("\n| config | name | a us | b us/kb | h us/kb | g us/wave | bw TB/s | e us | train times | train med / p90 | "
      "held-out times | held-out med / p90 |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c, th in res["params"].items():
        tr, he = res["train_error"][c], res["heldout_error"].get(c, {"cells": 0, "median": None, "p90": None})
        f = lambda s: "-" if s["median"] is None else f"{100 * s['median']:.1f}% / {100 * s['p90']:.1f}%"  # noqa: E731
        p(f"| {c} | {C.CONFIG_BY_ID[int(c)].name} | {th['a']:.2f} | {th['b']:.4f} | {th['h']:.4f} | {th['g']:.3f} | "
          f"{th['bw'] / 1e6:.2f} | {th['e']:.2f} | {tr['cells']} | {f(tr)} | {he['cells']} | {f(he)} |")
    for lab, s in (("training", res["train_error_all"]), ("held-out", res["heldout_error_all"])):
        p(f"\n{lab} |pred / measured - 1| over {s['cells']} (config, cell) times: median {100 * s['median']:.1f}%, "
          f"p90 {100 * s['p90']:.1f}%")
    p(f"configs with fewer than {MIN_TRAIN_CELLS} training times (not modelled): {res['skipped_configs']}")
    p("\nHeld-out cells, geomean cuBLASLt / ours (> 1: ours faster), the pick among the configs measured there:\n")
    p("| M | cells | candidates (mean) | model argmin | rules | oracle |")
    p("|---|---|---|---|---|---|")
    for m, v in res["choice"].items():
        p(f"| {m} | {v['cells']} | {v['mean_candidates']:.1f} | {v['model']:.3f} | {v['rules']:.3f} | "
          f"{v['oracle']:.3f} |")
    a = res["choice_all"]
    p(f"| all | {a['cells']} | | {a['model']:.3f} | {a['rules']:.3f} | {a['oracle']:.3f} |")
    p(f"\nheld-out cells left out (rules' choice not measured, or no other config): {res['choice_skipped_cells']}")
    p("\nCells where the model's pick differs from the rules' (config/s<splits>; us measured, predicted):\n")
    p("| layer | M | N | K | rules | us | model | us | model / rules | predicted rules / model | oracle |")
    p("|---|---|---|---|---|---|---|---|---|---|---|")
    for ch in res["changed"]:
        p(f"| {ch['layer']} | {ch['M']} | {ch['N']} | {ch['K']} | {_name(ch['rules'])} | {ch['us_rules']:.2f} | "
          f"{_name(ch['model'])} | {ch['us_model']:.2f} | {ch['us_model'] / ch['us_rules']:.3f} | "
          f"{ch['pred_rules']:.2f} / {ch['pred_model']:.2f} | {_name(ch['oracle'])} {ch['us_oracle']:.2f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the tables as JSON to this path")
    args = ap.parse_args(argv)
    res = run()
    print_tables(res)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
