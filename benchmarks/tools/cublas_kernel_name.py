"""Print the CUDA kernel names torch._scaled_mm (cuBLASLt) and our sm90 op launch for given shapes
(tile shape and cluster are in cuBLASLt's kernel names). Usage: python -m benchmarks.tools.cublas_kernel_name"""

import torch
from torch.profiler import ProfilerActivity, profile

import fp8_linear.kernels as kern

for m, n, k in ((8192, 8192, 8192), (4096, 28672, 4096), (2048, 6144, 4096), (6144, 6144, 1280)):
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    s = torch.ones((), device="cuda")
    for _ in range(3):
        torch._scaled_mm(a, b.t(), scale_a=s, scale_b=s, out_dtype=torch.bfloat16)
        kern.sm90_gemm(a, b, s.reshape(1), s.reshape(1), None, torch.bfloat16)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch._scaled_mm(a, b.t(), scale_a=s, scale_b=s, out_dtype=torch.bfloat16)
        kern.sm90_gemm(a, b, s.reshape(1), s.reshape(1), None, torch.bfloat16)
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print(f"{m}x{n}x{k}:", *names, sep="\n  ")
