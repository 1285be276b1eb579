"""Checkpoints: save / load in compressed-tensors and the other FP8 formats (DESIGN section 6)."""
