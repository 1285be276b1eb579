"""The GPU side of ``benchmarks.gemm_bench``: candidates per shape, timing, the table and the summary.

``summarize`` and ``format_row`` are plain functions of the rows (tested on the CPU); ``run`` needs a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from benchmarks.common import operands as O
from benchmarks.common import ours as U
from benchmarks.common import timing as T
from benchmarks.common.results import environment, write_json
from benchmarks.common.shapes import LARGE_M, gemm_bytes

US_PER_MS = 1e3
#: Run-time switches the kernel's host code reads at every launch (raster mode).
ENV_GROUP = "FP8_LINEAR_SM90_GROUP_M"
ENV_EVEN = "FP8_LINEAR_SM90_EVEN_WAVES"
#: (peer, ours) pairs whose time ratio is printed and summarized.
RATIOS = (("cublas_t", "ours"), ("cublas_row", "ours_row"), ("cublas_block", "ours_block"), ("bf16", "ours"),
          ("ours", "ours_block"))


def ratio_name(peer: str, mine: str) -> str:
    return f"{peer}/{mine}"


def summarize(rows: list[dict], ratios, columns: list[str]) -> dict:
    """Per M: the geomean of every peer-time / ours-time ratio over the shapes where both ran, with
    the shape count and the worst shape; over M >= 2048 as well; the per-channel cost (paired per
    round) mean and worst where both ours and ours_ch ran."""
    summary: dict = {}
    ms = sorted({r["M"] for r in rows})
    groups = [(f"M={m}", [r for r in rows if r["M"] == m]) for m in ms]
    big = [r for r in rows if r["M"] >= LARGE_M]
    if big and len(ms) > 1:
        groups.append((f"M>={LARGE_M}", big))
    for label, sel in groups:
        entry = {}
        for peer, mine in ratios:
            if peer not in columns or mine not in columns:
                continue
            name = ratio_name(peer, mine)
            vals = [(r["ratios"][name], r) for r in sel if r["ratios"].get(name) is not None]
            if vals:
                worst = min(vals, key=lambda v: v[0])
                entry[name] = {"geomean": T.geomean(v for v, _ in vals), "shapes": len(vals),
                               "worst": worst[0], "worst_shape": f"{worst[1]['M']}x{worst[1]['N']}x{worst[1]['K']}"}
        costs = [r["channel_cost"] for r in sel if r.get("channel_cost") is not None]
        if costs:
            entry["channel_cost"] = {"mean": sum(costs) / len(costs), "worst": max(costs)}
        if entry:
            summary[label] = entry
    return summary


def format_summary(summary: dict) -> list[str]:
    lines = []
    for label, entry in summary.items():
        parts = [f"{name} {v['geomean']:.3f} (n={v['shapes']}, worst {v['worst']:.3f} at {v['worst_shape']})"
                 for name, v in entry.items() if name != "channel_cost"]
        if "channel_cost" in entry:
            c = entry["channel_cost"]
            parts.append(f"per-channel cost mean {100 * c['mean']:+.1f}% worst {100 * c['worst']:+.1f}%")
        lines.append(f"{label:>9}: " + "; ".join(parts))
    return lines


def _width(column: str) -> int:
    """A time column's width: 13, or the label and one space where the label is longer."""
    return max(13, len(column) + 1)


def header(columns: list[str], ratios) -> str:
    cols = "".join(f"{c:>{_width(c)}}" for c in columns)
    rat = "".join(f"{ratio_name(p, m):>25}" for p, m in ratios)
    return f"{'layer':<22}{'M':>6}{'N':>7}{'K':>7} {'config':<16}|{cols} |{'TFLOPS':>7}{'TB/s':>6} |{rat}"


def format_row(row: dict, columns: list[str], ratios) -> str:
    """One table line: times in us ('n/a' where a candidate did not run), ours' TFLOPS and TB/s, ratios.
    The config shown is the block path's choice where the table has an ``ours_block`` column, else the
    per-tensor choice."""
    cols = "".join(f"{row['us'][c]:{_width(c)}.1f}" if row["us"].get(c) is not None else f"{'n/a':>{_width(c)}}"
                   for c in columns)
    config = row.get("config_block", row["config"]) if "ours_block" in columns else row["config"]
    rat = "".join(f"{row['ratios'][ratio_name(p, m)]:25.3f}" if row['ratios'].get(ratio_name(p, m)) is not None
                  else f"{'-':>25}" for p, m in ratios)
    tf = f"{row['tflops']:7.0f}" if row.get("tflops") is not None else f"{'-':>7}"
    tb = f"{row['tbps']:6.2f}" if row.get("tbps") is not None else f"{'-':>6}"
    return f"{row['layer'][:21]:<22}{row['M']:>6}{row['N']:>7}{row['K']:>7} {config[:15]:<16}|{cols} |{tf}{tb} |{rat}"


def calc_diff(x, y) -> float:
    """docs/design.md section 7: ``1 - 2 sum(x y) / sum(x^2 + y^2)`` in fp64."""
    x, y = x.double(), y.double()
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else float(1 - 2 * (x * y).sum() / den)


def with_env(fn, name: str, value: str, name2: str = "", value2: str = ""):
    """``fn`` with environment variables set around each call (run-time switches the kernel's host
    code reads at every launch)."""
    def call():
        os.environ[name] = value
        if name2:
            os.environ[name2] = value2
        try:
            return fn()
        finally:
            os.environ.pop(name, None)
            if name2:
                os.environ.pop(name2, None)
    return call


@dataclass
class Operands:
    """One copy of a shape's operands and every scale kind (docs/design.md section 2 layouts)."""

    a: object
    b: object
    s1: object  # per-tensor scale_a [1]
    s2: object  # per-tensor scale_b [1]
    sa_row: object  # per-token [M, 1]
    sb_row: object  # per-channel [N, 1]
    sa_group: object  # 1x128 groups [M, ceil(K/128)]
    sb_block: object  # 128x128 blocks [ceil(N/128), ceil(K/128)]


def make_operands(m: int, n: int, k: int, device: str = "cuda") -> Operands:
    """Fresh random e4m3 ``a`` [M, K] and ``b`` [N, K] with scales of every kind, on ``device``."""
    import torch

    return Operands(O.make_operand(m, k, device=device), O.make_operand(n, k, device=device),
                    torch.tensor([0.7], device=device), torch.tensor([1.3], device=device),
                    O.make_scale("row", m, k, device), O.make_scale("row", n, k, device),
                    O.make_scale("group", m, k, device), O.make_scale("block", n, k, device))


def calls_for(plan, ops: Operands, forced: list, na: dict) -> dict:
    """``{column: call}`` on one operand copy; a column that cannot be built goes to ``na`` with why."""
    import torch

    bf = torch.bfloat16
    a, b = ops.a, ops.b
    cols = set(plan.columns)
    built = {}
    if "ours" in cols:
        built["ours"] = U.ours_call(a, b, ops.s1, ops.s2)
    if "ours_ch" in cols:
        built["ours_ch"] = U.ours_call(a, b, ops.s1, ops.sb_row)
    if "ours_row" in cols:
        built["ours_row"] = U.ours_call(a, b, ops.sa_row, ops.sb_row)
    if "ours_block" in cols:
        fn, why = U.ours_block_call(a, b, ops.sa_group, ops.sb_block)
        if fn is None:
            na["ours_block"] = why
        else:
            built["ours_block"] = fn
    if "cublas_t" in cols:
        st_a, st_b = ops.s1.reshape(()), ops.s2.reshape(())
        built["cublas_t"] = lambda: torch._scaled_mm(a, b.t(), scale_a=st_a, scale_b=st_b, out_dtype=bf)
    if "cublas_row" in cols:
        sb_row_t = ops.sb_row.reshape(1, -1).contiguous()
        built["cublas_row"] = lambda: torch._scaled_mm(a, b.t(), scale_a=ops.sa_row, scale_b=sb_row_t, out_dtype=bf)
    if "cublas_block" in cols:
        built["cublas_block"] = O.cublas_block_call(a, b, ops.sa_group, ops.sb_block)
    if "bf16" in cols:
        abf, bbf = a.to(bf), b.to(bf)
        built["bf16"] = lambda: torch.matmul(abf, bbf.t())
    # block mode: forced configs and split factors run the block-scaled instances (a config oracle for
    # fine-grained scales); the other modes: per-tensor scales
    sa_f, sb_f = (ops.sa_group, ops.sb_block) if plan.mode == "block" else (ops.s1, ops.s2)
    for cfg in (forced if plan.mode != "raster" else []):
        lab = U.config_label(cfg)
        if plan.mode == "block" and not cfg.block_scales:
            na[f"cfg{lab}"] = "no block-scaled instances"
            continue
        built[f"cfg{lab}"] = U.ours_call(a, b, sa_f, sb_f, config=cfg, splits=1 if plan.mode == "splitk" else None)
        if "ours_ch" in cols:
            built[f"cfg{lab}_ch"] = U.ours_call(a, b, ops.s1, ops.sb_row, config=cfg)
    for s in plan.splits:
        built[f"s{s}"] = U.ours_call(a, b, sa_f, sb_f, splits=s)
    for v in plan.env_values:
        built[f"env{v}"] = with_env(U.ours_call(a, b, ops.s1, ops.s2), plan.env_name, v)
    for cfg in (forced if plan.mode == "raster" else []):
        for g in plan.groups:
            for e in ("", "e") if plan.even_waves else ("",):
                fn = U.ours_call(a, b, ops.s1, ops.s2, config=cfg)
                built[f"c{U.config_label(cfg)}g{g}{e}"] = with_env(fn, ENV_GROUP, str(g), ENV_EVEN, "1" if e else "0")
    return built


def candidates(plan, shape, copies: int, forced: list, device: str = "cuda") -> tuple[dict, dict]:
    """``({column: [call per operand copy]}, {column: reason it cannot run})`` for one shape; each copy
    has fresh random operands on ``device`` (the decode mode rotates through them)."""
    calls: dict[str, list] = {}
    na: dict[str, str] = {}
    for _ in range(copies):
        for name, fn in calls_for(plan, make_operands(*shape.mnk, device=device), forced, na).items():
            calls.setdefault(name, []).append(fn)
    return calls, na


def probe(calls: dict, na: dict) -> dict:
    """Run every candidate once (first copy); one that raises moves to ``na`` with the error's text.
    Returns the first copy's outputs, for the correctness check."""
    import torch

    outs = {}
    for name in list(calls):
        try:
            outs[name] = calls[name][0]()
            if outs[name].is_cuda:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - e.g. CUBLAS_STATUS_NOT_SUPPORTED: reported, not fatal
            na[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
            del calls[name]
    return outs


def in_graphs(plan, m: int) -> bool:
    """Whether a shape of ``plan`` is timed in CUDA graphs over rotated operand copies."""
    return plan.mode == "decode" or (plan.mode in ("block", "splitk") and m < LARGE_M)


def time_candidates(plan, args, calls: dict, m: int) -> dict:
    if plan.device != "cuda":
        return T.time_host({name: c[0] for name, c in calls.items()}, rounds=args.rounds)
    if in_graphs(plan, m):
        return T.time_graph(calls, rounds=args.rounds)
    fns = {name: c[0] for name, c in calls.items()}
    if plan.mode == "burst":
        return T.time_burst(fns, rounds=args.rounds, rep=args.rep)
    batch = 10 if plan.mode == "raster" else T.BURN_BATCH
    return T.time_steady(fns, rounds=args.rounds, burn_s=args.burn, rep=args.rep, batch=batch)


#: Statistic over rounds per mode: the median for interleaved short timings, the best for steady state.
STAT = {"burst": T.median, "decode": T.median, "steady": T.best, "splitk": T.best, "raster": T.best,
        "block": T.median}


def measure_shape(plan, args, shape, forced: list) -> dict:
    import torch

    m, n, k = shape.mnk
    copies = 1
    if in_graphs(plan, m):
        copies = O.rotation_copies(gemm_bytes(m, n, k, out_bytes=0), args.rotate_mb * 2**20)
    calls, na = candidates(plan, shape, copies, forced, device=plan.device)
    outs = probe(calls, na)
    times = time_candidates(plan, args, calls, m)
    for name, ts in times.items():
        if isinstance(ts, str):
            na[name] = ts
    stat = STAT[plan.mode]
    us = {name: stat(ts) * US_PER_MS for name, ts in times.items() if isinstance(ts, list)}
    row = {"layer": shape.layer, "M": m, "N": n, "K": k, "copies": copies, "us": us, "rounds_ms": times, "na": na,
           "ratios": {}, "config": U.chosen(m, n, k, torch.ones(1)), "config_row": U.chosen(m, n, k, torch.ones(m)),
           "config_block": U.chosen(m, n, k, torch.ones(m), block=True)}
    for peer, mine in RATIOS:
        if us.get(peer) and us.get(mine):
            row["ratios"][ratio_name(peer, mine)] = us[peer] / us[mine]
    if us.get("ours"):
        row["tflops"] = 2.0 * m * n * k / (us["ours"] * 1e-6) / 1e12
        row["tbps"] = gemm_bytes(m, n, k) / (us["ours"] * 1e-6) / 1e12
    if isinstance(times.get("ours"), list) and isinstance(times.get("ours_ch"), list):
        row["channel_cost"] = T.paired_cost(times["ours_ch"], times["ours"])
    for x, y in (("ours", "cublas_t"), ("ours_block", "cublas_block")):
        if x in outs and y in outs:
            row[f"diff_{x}_vs_{y}"] = calc_diff(outs[x].float(), outs[y].float())
    del calls, outs
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return row


def run(plan, args) -> int:
    """Measure every shape of ``plan``, print the table and the summary, write the JSON."""
    forced = [U.resolve_config(c) for c in plan.configs]
    extra = [f"cfg{U.config_label(c)}" for c in forced if plan.mode != "raster"]
    extra += [f"cfg{U.config_label(c)}_ch" for c in forced if "ours_ch" in plan.columns and plan.mode != "raster"]
    extra += [f"s{s}" for s in plan.splits] + [f"env{v}" for v in plan.env_values]
    extra += [f"c{U.config_label(c)}g{g}{e}" for c in (forced if plan.mode == "raster" else [])
              for g in plan.groups for e in (("", "e") if plan.even_waves else ("",))]
    columns = list(plan.columns) + extra
    ratios = [(p, m) for p, m in RATIOS if p in columns and m in columns]
    print(f"gemm_bench --mode {plan.mode}: {len(plan.shapes)} shapes; us per call, bf16 out", flush=True)
    if plan.device == "cuda":
        T.warm_up(args.warm if plan.mode in ("steady", "raster") else min(args.warm, 1.0))
    print(header(columns, ratios), flush=True)
    rows, reasons = [], {}
    for shape in plan.shapes:
        row = measure_shape(plan, args, shape, forced)
        rows.append(row)
        for name, why in row["na"].items():
            reasons.setdefault((name, why), []).append(f"{row['M']}x{row['N']}x{row['K']}")
        print(format_row(row, columns, ratios), flush=True)
    for (name, why), where in reasons.items():
        print(f"n/a {name} on {len(where)} shapes (first {where[0]}): {why}")
    summary = summarize(rows, ratios, columns)
    print("geomean of peer time / ours (> 1: ours faster):")
    for line in format_summary(summary):
        print(line)
    for c in extra:
        vals = [r["us"]["cublas_t"] / r["us"][c] for r in rows if r["us"].get(c) and r["us"].get("cublas_t")]
        if vals:
            print(f"geomean cublas_t / {c} over {len(vals)} shapes: {T.geomean(vals):.3f}")
    if not args.no_json:
        meta = environment({"mode": plan.mode, "columns": columns, "rounds": args.rounds, "rep_ms": args.rep,
                            "burn_s": args.burn, "rotate_mb": args.rotate_mb, "out_dtype": "bfloat16"})
        path = write_json(f"gemm-{plan.mode}", meta, summary, rows, out=args.out, tag=args.tag)
        print(f"wrote {path}")
    return 0
