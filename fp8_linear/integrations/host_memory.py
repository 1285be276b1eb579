"""Give freed host memory back to the operating system while a model quantizes on load.

Why: ``from_pretrained`` with ``FP8LinearConfig`` materializes each Linear's high-precision weight on
the CPU (a few MB), quantizes it, and frees it, while the small FP8 weight and its scales stay. glibc's
``malloc`` raises its mmap threshold to the size of the first large block freed (up to 32 MB), so from
then on these weights come from the heap, and the long-lived FP8 tensors placed between the freed ones
pin the heap: the freed bytes stay resident. How many depends on where each block lands (which varies
between runs), so the process' resident memory grew by anything from 20 to 330 MB above the live
tensors (``mallinfo2().fordblks``, measured on SmolLM2-135M loaded in float32, the case where every
weight is cast to a new float32 tensor). ``malloc_trim(0)`` returns every free page of every arena
(glibc 2.8 and later), which bounds the held memory by the live tensors plus one layer's temporaries.

On a C library without ``malloc_trim`` (musl, macOS) :func:`release_freed_host_memory` does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim`` as a ctypes function, or ``None`` where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_host_memory() -> bool:
    """Return the free pages of the C heap to the OS (``malloc_trim(0)``); ``True`` if any were returned.

    Costs about 2 ms on a CPU (it walks every arena); call it once per layer, not per tensor op.
    """
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


__all__ = ["release_freed_host_memory"]
