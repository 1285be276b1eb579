"""GPU time of a call on an explicit device: CUDA events where the device is CUDA, the wall clock elsewhere,
and one decode step's linear layers replayed from a CUDA graph (the end-to-end benchmarks' split).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from torch import nn

#: Replays of the linear layers' CUDA graph whose median is reported.
GRAPH_REPS = 10
#: Calls timed off CUDA (a check of the script, not a measurement).
HOST_REPS = 3


def is_cuda(device: str | torch.device) -> bool:
    """Whether ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``) is a CUDA device."""
    return torch.device(device).type == "cuda"


def sync(device: str | torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def wall_s(fn: Callable[[], object], device: str | torch.device) -> float:
    """Wall seconds of one ``fn()``, the device synchronized before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def cuda_ms(fn: Callable[[], object], reps: int, device: str | torch.device) -> float:
    """Median ms of ``fn()`` over ``reps`` (>= 1) runs after one warm-up: CUDA events on a CUDA device,
    the wall clock elsewhere."""
    if reps < 1:
        raise ValueError(f"reps: expected at least 1, got {reps}")
    fn()
    times = []
    for _ in range(reps):
        if not is_cuda(device):
            times.append(wall_s(fn, device) * 1e3)
            continue
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize(device)
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def linear_step_ms(modules: list[nn.Module], batch: int, device: str | torch.device) -> float:
    """GPU ms of calling ``modules`` (each with ``in_features``) in order on random BF16 inputs
    ``[batch, in_features]`` (one decode step's linear layers at ``M = batch``), replayed from one CUDA
    graph: each layer's GEMM and activation quantization, nothing else. Off CUDA, the wall-clock median
    of :data:`HOST_REPS` eager calls (to check a script)."""
    xs = [torch.randn(batch, m.in_features, device=device, dtype=torch.bfloat16) for m in modules]

    def step():
        for m, x in zip(modules, xs):
            m(x)

    if not is_cuda(device):
        with torch.inference_mode():
            return cuda_ms(step, HOST_REPS, device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.inference_mode(), torch.cuda.stream(side):
        step()
        step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        step()
    return cuda_ms(graph.replay, GRAPH_REPS, device)
