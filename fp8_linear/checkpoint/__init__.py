"""Checkpoints: save / load in compressed-tensors and the other FP8 formats (docs/design.md section 6).

- :func:`save_quantized` writes compressed-tensors ``float-quantized`` (``save.py``, ``ct_config.py``).
- :func:`load_quantized` reads ours, llm-compressor's, vLLM/AutoFP8 ``fp8``, transformers
  ``FineGrainedFP8Config`` and ``fbgemm_fp8``, and ModelOpt FP8 (``readers.py``), checking every
  header first (``shards.py``) and materializing only the stored tensors (``load.py``).
"""

from .load import load_quantized
from .save import INCOMPLETE_MARKER, CheckpointExistsError, save_quantized

__all__ = ["save_quantized", "load_quantized", "CheckpointExistsError", "INCOMPLETE_MARKER"]
