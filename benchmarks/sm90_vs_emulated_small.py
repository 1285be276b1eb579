"""sm90 vs emulated (fp32 out) on small Llama-like shapes, tensor/row scales; prints calc_diff and the config.

Run on a Hopper GPU: python benchmarks/sm90_vs_emulated_small.py (results/sm90-vs-emulated-small-*.txt)."""
import os, torch, fp8_linear
from fp8_linear.kernels import select_config
def cd(x,y):
    x,y=x.double(),y.double(); return float(1-2*(x*y).sum()/(x*x+y*y).sum())
torch.manual_seed(0)
for m in (96, 64, 128, 200):
  for n,k in ((256,256),(128,256),(768,256),(256,768),(4096,4096)):
    a=(torch.randn(m,k,device='cuda')).to(torch.float8_e4m3fn); b=torch.randn(n,k,device='cuda').to(torch.float8_e4m3fn)
    for sk in ('tt','tr','rr'):
      sa=torch.rand(1,device='cuda')+.5 if sk[0]=='t' else torch.rand(m,1,device='cuda')+.5
      sb=torch.rand(1,device='cuda')+.5 if sk[1]=='t' else torch.rand(n,1,device='cuda')+.5
      os.environ['FP8_LINEAR_BACKEND']='sm90'; o=fp8_linear.fp8_gemm(a,b,sa,sb,out_dtype=torch.float32)
      os.environ['FP8_LINEAR_BACKEND']='emulated'; r=fp8_linear.fp8_gemm(a,b,sa,sb,out_dtype=torch.float32)
      d=cd(o,r)
      print(m,n,k,sk,'cfg',select_config(m,n,k).id,'diff %.2e'%d, 'BAD' if d>1e-7 else '')
