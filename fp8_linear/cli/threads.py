"""The torch thread count of a CLI run: what ``--threads`` asks for, else the cores other processes leave free."""

from __future__ import annotations

import os

from .common import debug


def busy_elsewhere() -> float:
    """CPUs that other processes keep busy now: the smaller of the 1-minute load average and the
    number of runnable tasks other than this one (``/proc/loadavg``; the load average alone still
    counts a job that ended a minute ago)."""
    load = os.getloadavg()[0]
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0]) - 1  # this process is one of them
    except (OSError, ValueError, IndexError):
        return load
    return min(load, max(0, running))


def pick_threads(requested: int = 0, busy: float | None = None) -> int:
    """Torch intra-op threads for this run: ``requested`` when > 0, else the cores other processes
    leave free (``cpu_count - busy``, ``busy`` defaulting to :func:`busy_elsewhere`; at least 1, at
    most torch's default).

    On a shared CPU, a thread pool larger than the free cores stalls at every op's barrier: on a
    2-core machine with a load of ~6, one thread ran SmolLM2's forward 2x faster than two; on an
    idle one, two threads calibrated 32 x 512 tokens in 42.7 s against 70.3 s with one
    (benchmarks/results/calibration_time_smollm2_cpu_20261129_fp32calib_idle*.txt).
    """
    import torch

    if requested > 0:
        return requested
    free = (os.cpu_count() or 1) - (busy_elsewhere() if busy is None else busy)
    return max(1, min(torch.get_num_threads(), int(free + 0.5)))


def set_threads(requested: int = 0) -> int:
    """Set torch's thread count for this run (:func:`pick_threads`); the choice is printed under ``-v``."""
    import torch

    busy = busy_elsewhere()  # read once: the number printed is the one the choice used
    n = pick_threads(requested or 0, busy)
    torch.set_num_threads(n)
    debug(f"torch threads: {n} (cpus {os.cpu_count()}, busy elsewhere {busy:.1f})")
    return n
