"""torch 2.13.0+cpu: bf16 ``scaled_dot_product_attention`` on a CPU with AMX fails under
``ATEN_CPU_CAPABILITY=avx2`` or ``default`` ("pack_vnni2 is only supported when avx512 is supported").

    python tests/repro/sdpa_bf16_avx2_on_amx.py      # prints one line per setting

The CPU flash-attention kernel asks oneDNN whether its bf16 brgemm can run (yes: the CPU has AMX), then
packs its operands with the AVX2 (or unvectorized) build of ``pack_vnni2``, which only the AVX-512 build
implements. A real AVX2-only CPU has no AMX, so oneDNN says no there; ``ONEDNN_MAX_CPU_ISA=AVX2`` makes
oneDNN say the same here, and the run is correct (``make test-matrix`` sets it with its avx2 setting).
"""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = r"""
import torch
q = torch.randn(1, 4, 64, 64, dtype=torch.bfloat16)
try:
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    print(f"isa {torch.backends.cpu.get_cpu_capability():8s} bf16 sdpa ok")
except RuntimeError as e:
    print(f"isa {torch.backends.cpu.get_cpu_capability():8s} bf16 sdpa RuntimeError: {e}")
"""

SETTINGS = ({}, {"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "default"},
            {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"})


def main() -> int:
    for extra in SETTINGS:
        env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
        env.update(extra)
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
        label = " ".join(f"{k}={v}" for k, v in extra.items()) or "(native)"
        print(f"{label:48s} {r.stdout.strip() or r.stderr.strip().splitlines()[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
