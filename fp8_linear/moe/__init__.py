"""Mixture-of-experts support: FP8 fused experts, their grouped GEMM backends, and the transformers glue (docs/moe.md)."""
