"""Timing transformers' ``generate`` token by token, eager or compiled, and forgetting a compile between paths.

:class:`StepClock` (a ``generate`` streamer) stamps the host clock at every token ``generate`` emits:
TTFT is the first token's stamp, a decode step the interval between two stamps (``generate``
synchronizes with the GPU once per token, so the interval is the step's wall time). The median
interval is the steady step: the first decode step of each ``generate`` call, which re-records the
CUDA graph for the call's new static cache, is reported apart (``first_step_ms``).
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from benchmarks.common.greedy_compare import FirstScores


class StepClock:
    """A ``generate`` streamer that records ``time.perf_counter()`` at each ``put`` (the prompt, then each token)."""

    def __init__(self):
        self.stamps: list[float] = []

    def put(self, value) -> None:  # noqa: ARG002 - the tokens themselves are not needed
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass

    def timings(self, t0: float) -> dict:
        """TTFT (``t0`` -> first new token) and the decode-step intervals of one ``generate`` call, in ms:
        ``ttft_ms`` always (NaN before any token), ``step_ms`` (median), ``first_step_ms`` and
        ``mean_step_ms`` once there are two new tokens."""
        new = self.stamps[1:]  # stamps[0] is the prompt
        steps = [(b - a) * 1e3 for a, b in zip(new, new[1:])]
        out = dict(ttft_ms=(new[0] - t0) * 1e3 if new else float("nan"))
        if steps:
            out.update(step_ms=statistics.median(steps), first_step_ms=steps[0],
                       mean_step_ms=statistics.fmean(steps))
        return out


def timed_generate(model, ids: torch.Tensor, new: int, kw: dict, scores: FirstScores | None = None,
                   clock: StepClock | None = None, gc_off: bool = True) -> tuple[dict, torch.Tensor]:
    """One greedy ``generate`` of exactly ``new`` tokens after the prompt ``ids`` (``[batch, prompt]``
    int64, on the model's device) with a :class:`StepClock` (``clock``, a new one if not given), after a
    full collection, garbage collection off while it runs (left on with ``gc_off=False``); ``kw`` goes to
    ``generate`` (e.g. ``cache_implementation="static"``), ``scores`` records the first logits. Returns
    :meth:`StepClock.timings` and the new tokens ``[batch, new]`` (int64, on the host)."""
    from transformers import LogitsProcessorList

    clock = StepClock() if clock is None else clock
    extra = dict(logits_processor=LogitsProcessorList([scores])) if scores is not None else {}
    gc.collect()
    was_enabled = gc.isenabled()
    if gc_off:
        gc.disable()
    try:
        if ids.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, streamer=clock, **kw, **extra)
    finally:
        if was_enabled:
            gc.enable()
    return clock.timings(t0), out[:, ids.shape[1]:].cpu()


def stop_after(length: int):
    """A ``generate`` stopping criterion: stop once the sequences are ``length`` tokens long (so two calls
    of different lengths share ``max_new_tokens``, hence one static-cache shape and one compiled graph)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= length, dtype=torch.bool,
                              device=input_ids.device)

    return StoppingCriteriaList([_StopAfter()])


def reset_compiled(model) -> None:
    """Forget compiled code (dynamo's caches and transformers' compiled decode step of ``model``, if
    given) and free memory (the CUDA caching allocator's too, where CUDA is initialized)."""
    torch._dynamo.reset()
    if model is not None:
        for attr in ("_compiled_call", "_last_compile_config"):
            model.__dict__.pop(attr, None)
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
