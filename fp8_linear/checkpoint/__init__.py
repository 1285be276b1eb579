"""Checkpoints: save / load in compressed-tensors and the other FP8 formats (docs/design.md section 6,
docs/checkpoints.md).

- :func:`save_quantized` writes compressed-tensors ``float-quantized`` (``save.py``, ``ct_config.py``),
  swapping the finished folder into place atomically (``swap.py``).
- :func:`load_quantized` reads ours, llm-compressor's, vLLM/AutoFP8 ``fp8``, transformers
  ``FineGrainedFP8Config`` and ``fbgemm_fp8``, and ModelOpt FP8 (``readers.py``), as untrusted input:
  config fields checked (``fields.py``, ``model_config.py``), every header checked first
  (``shards.py``), files confined to the folder and read as one snapshot (``folder.py``), and then
  only the stored tensors materialized (``load.py``).
"""

from .load import load_quantized
from .save import INCOMPLETE_MARKER, CheckpointExistsError, save_quantized

__all__ = ["save_quantized", "load_quantized", "CheckpointExistsError", "INCOMPLETE_MARKER"]
