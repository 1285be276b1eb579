"""Load checkpoints with ``load_quantized`` in this (fresh) process and save their outputs.

Usage: ``python fresh_load.py '<json list of jobs>'``; each job is
``{"ckpt": folder, "inputs": safetensors file of the model's keyword inputs, "out": safetensors file to write,
"dtype": "float32"}``. Prints one JSON line: per job ``{"ckpt", "load_s", "rss_before_mb", "rss_after_mb",
"ckpt_mb"}`` (peak RSS of this process before the load, with the model's code imported, and after it;
the checkpoint's safetensors size).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def folder_mb(folder: str) -> float:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors")) / 2**20


def main(jobs: list[dict]) -> list[dict]:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from fp8_linear import load_quantized

    report = []
    for job in jobs:
        # import the model's code first (importing transformers' Llama modules alone adds ~130 MB of RSS)
        arch = (transformers.AutoConfig.from_pretrained(job["ckpt"]).architectures or [None])[0]
        getattr(transformers, arch, None) if arch else None
        before = peak_rss_mb()
        t0 = time.perf_counter()
        model = load_quantized(job["ckpt"], dtype=getattr(torch, job.get("dtype", "float32")))
        load_s = time.perf_counter() - t0
        after = peak_rss_mb()
        if job.get("inputs"):
            batch = load_file(job["inputs"])
            with torch.inference_mode():
                out = model(**batch)
            y = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
            save_file({"output": y.float().contiguous()}, job["out"])
        report.append({"ckpt": job["ckpt"], "load_s": load_s, "rss_before_mb": before, "rss_after_mb": after,
                       "ckpt_mb": folder_mb(job["ckpt"])})
        del model
    return report


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
