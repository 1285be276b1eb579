"""Peak host memory of ``from_pretrained`` with ``FP8LinearConfig``, measured in this fresh process.

    python tests/integrations/peak_memory.py <hf folder> [--scheme fp8-dynamic] [--dtype bfloat16]

Prints one JSON line: ``fp8_model_mb`` (bytes of every tensor of the loaded model: FP8 weights, fp32
scales, the high-precision rest), ``largest_linear_hp_mb`` (the largest Linear weight in the load dtype),
``checkpoint_mb``, and the memory added by the load (transformers and the model's code imported first):

- ``peak_anon_mb``: peak of the process' anonymous resident memory (``RssAnon``: what it allocates),
  sampled every millisecond and right after every layer's quantization;
- ``model_file_backed_mb``: tensors of the loaded model that are views of the checkpoint's memory map
  (transformers does not copy an unquantized tensor whose stored dtype is the load dtype);
- ``peak_host_mb`` = the two added: the memory the load holds (the measure compared with the FP8 model);
- ``peak_rss_mb``: ``VmHWM`` (reset before the load). It also counts every checkpoint page safetensors
  mapped while reading, including the high-precision weights already quantized and dropped: clean page
  cache of the file, not memory the load holds (the kernel reclaims it under pressure).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

SAMPLE_S = 0.001


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class AnonPeak:
    """Peak ``RssAnon`` while active: a sampling thread plus explicit :meth:`sample` calls."""

    def __init__(self):
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        self.peak_kb = max(self.peak_kb, _status_kb("RssAnon"))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(SAMPLE_S)

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


def _mapped_ranges(folder: str) -> list[tuple[int, int]]:
    """Address ranges of this process' memory maps of the ``.safetensors`` files in ``folder``."""
    real = os.path.realpath(folder)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[-1].endswith(".safetensors") and os.path.dirname(parts[-1]) == real:
                lo, hi = parts[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


def _file_backed_bytes(model, ranges) -> int:
    """Bytes of the model's tensors whose data lies in one of ``ranges``."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        ptr = t.data_ptr()
        if ptr not in seen and any(lo <= ptr < hi for lo, hi in ranges):
            seen.add(ptr)
            total += t.numel() * t.element_size()
    return total


def _tensor_bytes(model) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.untyped_storage().data_ptr(), t.dtype)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--scheme", default="fp8-dynamic")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    import torch
    import transformers
    from safetensors import safe_open

    import fp8_linear
    from fp8_linear.integrations import transformers_quantizer

    dtype = getattr(torch, args.dtype)
    config = transformers.AutoConfig.from_pretrained(args.folder)
    getattr(transformers, config.architectures[0])  # import the model's code before measuring
    largest = 0
    ckpt = sum(os.path.getsize(os.path.join(args.folder, f)) for f in os.listdir(args.folder) if f.endswith(".safetensors"))
    for fn in (f for f in os.listdir(args.folder) if f.endswith(".safetensors")):
        with safe_open(os.path.join(args.folder, fn), "pt") as f:
            for k in f.keys():
                shape = f.get_slice(k).get_shape()
                if k.endswith("proj.weight") or k.endswith("lm_head.weight"):
                    largest = max(largest, shape[0] * shape[1] * dtype.itemsize)
    cfg = fp8_linear.FP8LinearConfig(scheme=args.scheme)

    peak = AnonPeak()
    quantize = transformers_quantizer.FP8LinearHfQuantizer.quantize_weight

    def sampled(self, key, w):  # the one high-precision weight is alive here: sample at its peak
        out = quantize(self, key, w)
        peak.sample()
        return out

    transformers_quantizer.FP8LinearHfQuantizer.quantize_weight = sampled
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    rss0, anon0 = _status_kb("VmHWM"), _status_kb("RssAnon")
    t0 = time.perf_counter()
    with peak:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.folder, dtype=dtype, quantization_config=cfg)
    load_s = time.perf_counter() - t0
    mb = 1 / 2**20
    anon = (peak.peak_kb - anon0) / 1024
    mapped = _file_backed_bytes(model, _mapped_ranges(args.folder)) * mb
    print(json.dumps({
        "scheme": args.scheme, "dtype": args.dtype, "load_s": round(load_s, 2),
        "fp8_model_mb": round(_tensor_bytes(model) * mb, 1), "largest_linear_hp_mb": round(largest * mb, 1),
        "checkpoint_mb": round(ckpt * mb, 1), "peak_anon_mb": round(anon, 1), "model_file_backed_mb": round(mapped, 1),
        "peak_host_mb": round(anon + mapped, 1), "peak_rss_mb": round((_status_kb("VmHWM") - rss0) / 1024, 1),
    }))


if __name__ == "__main__":
    main()
