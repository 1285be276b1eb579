import torch, statistics, sys
sys.path.insert(0, "tests")
from helpers import calc_diff
from fp8_linear.backends.sm90 import kernels_module
kern = kernels_module()
E4 = torch.float8_e4m3fn
for (m, n, k) in [(1, 72, 4096), (1, 4096, 4096), (64, 4104, 16400), (7, 200, 16400)]:
    for cfg in (0, 1, 3, 7):
        res = {}
        for sp in (1, 2, 16):
            ds = []
            for seed in range(20):
                g = torch.Generator(device="cuda").manual_seed(seed)
                a = (torch.randn(m, k, device="cuda", generator=g) * 2).to(E4)
                b = (torch.randn(n, k, device="cuda", generator=g) * 2).to(E4)
                sa = torch.rand(m, 1, device="cuda", generator=g) + 0.5
                sb = torch.rand(n, 1, device="cuda", generator=g) + 0.5
                out = torch.empty(m, n, device="cuda", dtype=torch.float32)
                kern.sm90_gemm_out(a, b, sa.reshape(-1), sb.reshape(-1), None, out, cfg, False, sp)
                ref = (a.double() * sa.double()) @ (b.double() * sb.double()).T
                ds.append(calc_diff(out, ref))
            res[sp] = (statistics.mean(ds), max(ds))
        print(m, n, k, "cfg", cfg, " ".join(f"s{sp}: mean {v[0]:.2e} max {v[1]:.2e}" for sp, v in res.items()), flush=True)
