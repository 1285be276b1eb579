"""Launch one sm90 GEMM config on one shape a few times: the target for `ncu` profiling.

Usage: ncu --kernel-name regex:'sm90|nvjet'  --launch-skip 2 --launch-count 1 \
           python3 -m benchmarks.tools.profile_one --config 0 --shape 8192 8192 8192
"""

from __future__ import annotations

import argparse

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=int, default=0, help="sm90 config id; -1: torch._scaled_mm (cuBLASLt)")
    ap.add_argument("--shape", type=int, nargs=3, default=[8192, 8192, 8192], metavar=("M", "N", "K"))
    ap.add_argument("--launches", type=int, default=4)
    ap.add_argument("--channel", action="store_true", help="per-channel scale_b instead of per-tensor")
    ap.add_argument("--block", action="store_true",
                    help="fine-grained scales: scale_a [M, ceil(K/128)], scale_b [ceil(N/128), ceil(K/128)]")
    args = ap.parse_args()
    m, n, k = args.shape
    if args.config < 0 and (args.channel or args.block):
        raise SystemExit("profile_one: --channel needs an sm90 config (the cuBLASLt target is per-tensor)")
    import fp8_linear.kernels as kern

    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.ones(1, device="cuda")
    sb = torch.rand(n if args.channel else 1, device="cuda") + 0.5
    if args.block:
        kb, nb = -(-k // 128), -(-n // 128)
        sa = torch.rand(m, kb, device="cuda") + 0.5
        sb = torch.rand(nb, kb, device="cuda") + 0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(args.launches):
        if args.config < 0:
            torch._scaled_mm(a, b.t(), scale_a=sa.reshape(()), scale_b=sb.reshape(()), out_dtype=torch.bfloat16)
        else:
            kern.sm90_gemm_out(a, b, sa, sb, None, out, args.config)
    torch.cuda.synchronize()
    print(f"profile_one: config {args.config} {m}x{n}x{k}, {args.launches} launches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
