"""Inductor's FX graph cache ignores ATEN_CPU_CAPABILITY: a CPU graph compiled under one vector ISA is
served, with its vector width baked in, to a process running under another (torch 2.13.0+cpu).

    python tests/repro/inductor_cpu_isa_cache.py          # on an AVX-512 x86 CPU; prints one line per run

It runs the same 3-op graph (``silu(a) * b``, fp32, 320 wide) in three fresh processes that share one
new inductor cache folder: native ISA (AVX-512: 16 floats a vector), then ``ATEN_CPU_CAPABILITY=avx2``
(8 floats), then ``default`` (no vector ISA). The second process loads the first one's cached wrapper
(loop step 16, ``loadu(ptr, 16)``), compiles its C++ for AVX2 and returns wrong values for half the
outputs; the third fails to compile it (``'at::vec' has not been declared``). Each run is correct
with ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` (pass ``--no-fx-cache``) or with a cache folder of its own. The
cache key (``torch._inductor.codecache.FxGraphHashDetails``) holds the thread count but not
``cpu_vec_isa.pick_vec_isa()``, which reads ``ATEN_CPU_CAPABILITY``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

CHILD = r"""
import torch
torch.manual_seed(0)
a, b = torch.randn(1, 320), torch.randn(1, 320)
f = torch.compile(lambda a, b: torch.nn.functional.silu(a) * b, fullgraph=True)
out, ref = f(a, b), torch.nn.functional.silu(a) * b
bad = (out != ref).sum().item()
print(f"isa {torch.backends.cpu.get_cpu_capability():8s} wrong outputs {bad:3d} of {out.numel()}, "
      f"max |diff| {(out - ref).abs().max().item():.3g}")
"""


def main() -> int:
    no_fx_cache = "--no-fx-cache" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as cache:
        for capability in (None, "avx2", "default"):
            env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
            env.update(TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS="1")
            if capability:
                env["ATEN_CPU_CAPABILITY"] = capability
            if no_fx_cache:
                env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
            r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
            errors = [line for line in r.stderr.splitlines() if "error:" in line] or r.stderr.splitlines()[-1:]
            tail = r.stdout.strip() or (errors[0].split("error:", 1)[-1].strip() if errors else "(no output)")
            print(f"ATEN_CPU_CAPABILITY={capability or '(unset)':8s} rc={r.returncode}  {tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
