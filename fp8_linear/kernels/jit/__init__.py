"""JIT build of the sm90 FP8 GEMM extension (torch.utils.cpp_extension + ninja).

The build folder is ``<cache root>/sm90-<key>``, where the key hashes every source and header, the
compiler flags, the nvcc version and the torch/python versions; ``FP8_LINEAR_CACHE`` overrides the
root (default ``~/.cache/fp8_linear``). Nothing here builds at import time: :func:`load` builds on
first use, once per process even when several threads ask at the same time.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
from functools import lru_cache

KERNELS_DIR = pathlib.Path(__file__).resolve().parents[1]
INCLUDE_DIR = KERNELS_DIR / "include"
CSRC_DIR = KERNELS_DIR / "csrc"

CUDA_FLAGS = (
    "-O3",
    "-std=c++17",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-lineinfo",
    "-Xptxas=-warn-spills",
)
#: Host flags of the torch binding. No -std here: torch.utils.cpp_extension passes the standard its
#: own headers were built with (C++20 for current torch); forcing -std=c++17 compiled torch's
#: headers in another language mode than libtorch. (Removing it did not cure the crash of a failing
#: TORCH_CHECK seen on the H200 image: see FP8_CHECK in csrc/binding.cpp.)
CXX_FLAGS = ("-O3",)

BUILD_MESSAGE = "fp8_linear: building sm90 kernel (first use)..."
_MARKER = "fp8_linear_build.ok"

_lock = threading.Lock()
_ext = None


def cache_root() -> pathlib.Path:
    env = os.environ.get("FP8_LINEAR_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "fp8_linear"


def source_files() -> list[pathlib.Path]:
    """Translation units: kernel .cu files (no torch headers) and the torch binding."""
    cus = sorted(CSRC_DIR.glob("*.cu"))
    return [*cus, CSRC_DIR / "binding.cpp"]


def header_files() -> list[pathlib.Path]:
    return sorted([*INCLUDE_DIR.glob("*.cuh"), *INCLUDE_DIR.glob("*.h"), *CSRC_DIR.glob("*.cuh")])


def find_nvcc() -> str | None:
    """Path of nvcc, as torch.utils.cpp_extension would use it (CUDA_HOME), or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cands = []
    if home:
        cands.append(pathlib.Path(home) / "bin" / "nvcc")
    which = shutil.which("nvcc")
    if which:
        cands.append(pathlib.Path(which))
    cands.append(pathlib.Path("/usr/local/cuda/bin/nvcc"))
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str | None = None) -> str:
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return "nvcc-missing"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "nvcc-unrunnable"
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "nvcc-unknown"


def toolchain_status() -> tuple[bool, str]:
    """Whether nvcc and ninja are there to build (does not build)."""
    if find_nvcc() is None:
        return False, "nvcc not found (set CUDA_HOME) to build the sm90 kernel"
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401
        except ImportError:
            return False, "ninja not found (pip install ninja) to build the sm90 kernel"
    return True, "ok"


def cache_key(files: list[pathlib.Path] | None = None, flags: tuple[str, ...] | None = None,
              nvcc: str | None = None, extra: str | None = None) -> str:
    """Hex digest over the sources' relative paths and bytes, the flags, the nvcc version and ``extra``."""
    h = hashlib.sha256()
    files = files if files is not None else [*source_files(), *header_files()]
    for f in sorted(files, key=lambda p: str(p)):
        try:
            rel = f.relative_to(KERNELS_DIR)
        except ValueError:
            rel = pathlib.Path(f.name)
        h.update(str(rel).encode())
        h.update(b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    for fl in flags if flags is not None else (*CUDA_FLAGS, "|", *CXX_FLAGS):
        h.update(fl.encode())
        h.update(b"\0")
    h.update((nvcc if nvcc is not None else nvcc_version()).encode())
    if extra is None:
        import torch

        extra = f"torch={torch.__version__};py={sys.version_info[0]}.{sys.version_info[1]}"
    h.update(extra.encode())
    return h.hexdigest()[:16]


def build_dir(key: str | None = None) -> pathlib.Path:
    return cache_root() / f"sm90-{key or cache_key()}"


def _import_built(name: str, folder: pathlib.Path):
    """Import the built extension ``name`` from ``folder`` (a plain import with the folder on sys.path
    for the duration; None when no built library is there)."""
    if not any(folder.glob(f"{name}*.so")):
        return None
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


def load(verbose: bool = False):
    """Return the built extension module, building it on first use (thread-safe)."""
    global _ext
    if _ext is not None:
        return _ext
    with _lock:
        if _ext is not None:
            return _ext
        import torch  # noqa: F401  (libtorch must be loaded before the extension)

        key = cache_key()
        name = f"fp8_linear_sm90_{key}"
        folder = build_dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        mod = None
        if (folder / _MARKER).exists():
            try:
                mod = _import_built(name, folder)
            except ImportError:
                mod = None
        if mod is None:
            ok, why = toolchain_status()
            if not ok:
                raise RuntimeError(f"fp8_linear: cannot build the sm90 kernel: {why}")
            print(BUILD_MESSAGE, file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            from torch.utils.cpp_extension import load as _load

            mod = _load(
                name=name,
                sources=[str(p) for p in source_files()],
                extra_cflags=list(CXX_FLAGS),
                extra_cuda_cflags=list(CUDA_FLAGS),
                extra_include_paths=[str(INCLUDE_DIR)],
                build_directory=str(folder),
                verbose=verbose,
            )
            (folder / _MARKER).write_text(f"built in {time.perf_counter() - t0:.1f} s\n")
            print(f"fp8_linear: sm90 kernel built in {time.perf_counter() - t0:.1f} s ({folder})",
                  file=sys.stderr, flush=True)
        _ext = mod
        return _ext


def is_loaded() -> bool:
    return _ext is not None
