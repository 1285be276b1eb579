"""Small awkward-shape sweep over every sm90 kernel config, format pair, scale kind and out dtype
(and split K where the shapes or a forced factor give it); run under compute-sanitizer by
benchmarks/tools/sanitize.sh. Exits 1 on a wrong result.

    python -m benchmarks.tools.sanitize_driver [--configs 1,7]"""

from __future__ import annotations

import sys

import torch


def block_sweep(kern, configs, cfgs, fmts, outs) -> tuple[int, int]:
    """Block-scaled launches (scale_a [M, ceil(K/128)], scale_b [ceil(N/128), ceil(K/128)]) of every config in
    ``cfgs`` that has them: ragged M / N / K (partial last group and block), several tiles per CTA for the
    large-M configs, forced split K where the config splits. Returns (launches, wrong ones)."""
    shapes = [(1, 72, 48, None), (7, 200, 1040, None), (129, 8, 1040, None), (64, 136, 272, None), (200, 264, 400, None)]
    multi_tile = [(1100, 2000, 112, None), (1030, 2056, 384, None)]
    runs = bad = 0
    for cfg in cfgs:
        c = configs.CONFIG_BY_ID[cfg]
        if not c.block_scales:
            continue
        cfg_shapes = shapes + (multi_tile if not c.swap_ab else []) + ([(70, 300, 2064, 5)] if c.split_k else [])
        for i, (m, n, k, splits) in enumerate(cfg_shapes):
            fa, fb = fmts[(cfg + i) % 4]
            kb, nb = -(-k // 128), -(-n // 128)
            a = (torch.randn(m, k, device="cuda") * 2).to(fa)
            b = (torch.randn(n, k, device="cuda") * 2).to(fb)
            sa = torch.rand(m, kb, device="cuda") + 0.5
            sb = torch.rand(nb, kb, device="cuda") + 0.5
            bias = [None, torch.randn(n, device="cuda").bfloat16()][i % 2]
            od = outs[(cfg + i) % 3]
            out = torch.full((m, n), float("nan"), device="cuda", dtype=od)
            kern.sm90_gemm_out(a, b, sa, sb, bias, out, cfg, splits=splits)
            ka = torch.arange(k, device="cuda") // 128
            a64 = a.double() * sa.double()[:, ka]
            b64 = b.double() * sb.double()[torch.arange(n, device="cuda") // 128][:, ka]
            ref = a64 @ b64.T + (bias.double() if bias is not None else 0)
            o = out.double()
            d = float(1 - 2 * (o * ref).sum() / (o * o + ref * ref).sum())
            runs += 1
            if not (bool(torch.isfinite(o).all()) and d < 1e-4):
                bad += 1
                print(f"BAD block cfg={cfg} M={m} N={n} K={k} {fa}/{fb} out={od} splits={splits} diff={d}")
    return runs, bad


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="", help="comma list of config ids or names (default: all)")
    ap.add_argument("--block", action="store_true",
                    help="only the block-scaled launches (1x128 x 128x128 scales) of the configs that have them")
    args = ap.parse_args()
    import fp8_linear.kernels as kern
    from fp8_linear.kernels import configs
    torch.manual_seed(0)
    fmts = [(torch.float8_e4m3fn, torch.float8_e4m3fn), (torch.float8_e4m3fn, torch.float8_e5m2),
            (torch.float8_e5m2, torch.float8_e4m3fn), (torch.float8_e5m2, torch.float8_e5m2)]
    outs = [torch.bfloat16, torch.float16, torch.float32]
    shapes = [(1, 72, 48), (7, 200, 16), (129, 8, 1040), (64, 136, 272), (200, 264, 400)]
    # More 128 x 128 tiles (144, 153) than SMs, so CTAs cross tile boundaries (the reuse of the epilogue's
    # staging, the stage ring): one, an even and an odd number of k-blocks per tile.
    # Only for the default large-M config and the swapped large-M configs
    # (its transposed staging; with N = 2000 its tiles cross the weight's rows): these shapes are ~40x the outputs of
    # the small ones, and racecheck's time grows with the shared-memory stores of the epilogue.
    multi_tile = [(1100, 2000, 112), (1030, 2056, 256), (1100, 2000, 384)]
    bad = 0
    runs = 0
    cfgs = [configs.config(c.strip()).id for c in args.configs.split(",") if c.strip()] or [c.id for c in configs.CONFIGS]
    if args.block:
        runs, bad = block_sweep(kern, configs, cfgs, fmts, outs)
        torch.cuda.synchronize()
        print(f"sanitize_driver --block: {runs} launches, {bad} wrong")
        return 1 if bad else 0
    for cfg in cfgs:
        c = configs.CONFIG_BY_ID[cfg]
        cfg_shapes = [(*s, None) for s in shapes]
        cfg_shapes += [(*s, None) for s in multi_tile] if (c.id == configs.LARGE_M_CONFIG or c.swap_tma_store) else []
        # split K forced (17 k-blocks -> 5 ranges of 4, the last of 1; M / N tails) where the config can split
        cfg_shapes += [(70, 300, 2064, 5)] if c.split_k else []
        for i, (m, n, k, splits) in enumerate(cfg_shapes):
            fa, fb = fmts[(cfg + i) % 4]
            a = (torch.randn(m, k, device="cuda") * 2).to(fa)
            b = (torch.randn(n, k, device="cuda") * 2).to(fb)
            sa = torch.rand(m if i % 2 else 1, device="cuda") + 0.5
            sb = torch.rand(n if i % 3 else 1, device="cuda") + 0.5
            bias = [None, None, torch.randn(n, device="cuda"), torch.randn(n, device="cuda").bfloat16()][i % 4]
            # without a bias a 16-bit output, so that every epilogue mode runs (sm90_epilogue.cuh, EpiMode:
            # i = 0 per-tensor scales, 1 and 5 per-token x per-channel, 4 per-tensor x per-channel)
            od = outs[(cfg + i) % 3] if bias is not None else outs[(cfg + i) % 2]
            out = torch.full((m, n), float("nan"), device="cuda", dtype=od)
            kern.sm90_gemm_out(a, b, sa, sb, bias, out, cfg, splits=splits)
            ref = (a.double() * sa.double().reshape(-1, 1)) @ (b.double() * sb.double().reshape(-1, 1)).T
            if bias is not None:
                ref = ref + bias.double()
            o = out.double()
            d = float(1 - 2 * (o * ref).sum() / (o * o + ref * ref).sum())
            ok = bool(torch.isfinite(o).all()) and d < 1e-4
            runs += 1
            if not ok:
                bad += 1
                print(f"BAD cfg={cfg} M={m} N={n} K={k} {fa}/{fb} out={od} diff={d}")
    torch.cuda.synchronize()
    print(f"sanitize_driver: {runs} launches, {bad} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
