"""Llama-3-8B- and Qwen2.5-7B-shaped causal LMs built from a config with random weights, and their prompts.

The end-to-end benchmarks measure speed, not accuracy, so the models are ``AutoModelForCausalLM.from_config``
of the public config.json values (:data:`MODELS`), BF16, seeded; ``tiny=True`` keeps the architecture at
a small width (:data:`TINY`) to check a benchmark script itself, also on a CPU.
"""

from __future__ import annotations

import torch

#: Config fields of the two model shapes (public config.json values).
MODELS = {
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256, rope_theta=500000.0,
                      max_position_embeddings=8192, rms_norm_eps=1e-5),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                       num_key_value_heads=4, num_hidden_layers=28, vocab_size=152064, rope_theta=1000000.0,
                       max_position_embeddings=32768, rms_norm_eps=1e-6),
}
#: ``tiny=True``: a small model of the same architecture (fields replacing those of :data:`MODELS`).
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=1024, num_hidden_layers=2)
#: The tiny Qwen3-MoE of the CPU quality and host-cost runs (8 experts, top-2; ``moe_bench --quality``,
#: ``moe_call_overhead``).
QUALITY_MOE = dict(model_type="qwen3_moe", vocab_size=256, hidden_size=128, intermediate_size=256,
                   moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                   max_position_embeddings=512, tie_word_embeddings=False)


def full_depth(name: str, tiny: bool = False) -> int:
    """Decoder layers of the named shape (of its :data:`TINY` form with ``tiny``)."""
    return (TINY if tiny else MODELS[name])["num_hidden_layers"]


def from_fields(fields: dict, layers: int | None, device: str | torch.device):
    """A BF16 ``*ForCausalLM`` of the config ``fields`` (``model_type`` plus config.json fields, as in
    :data:`MODELS`) with random weights (seed 0) on ``device``, in eval mode, with ``layers`` decoder
    layers (``None``: the config's); ``generate`` pads with token 0 and never stops early (no EOS)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(fields)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    if layers:
        cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def build_model(name: str, layers: int | None, device: str | torch.device, tiny: bool = False):
    """:func:`from_fields` of the shape ``name`` (a key of :data:`MODELS`; ``KeyError`` otherwise), at the
    :data:`TINY` width with ``tiny``."""
    if name not in MODELS:
        raise KeyError(f"model shape {name!r}: expected one of {sorted(MODELS)}")
    return from_fields(dict(MODELS[name], **(TINY if tiny else {})), layers, device)


def prompt_ids(vocab: int, batch: int, prompt: int, device: str | torch.device) -> torch.Tensor:
    """Random token ids ``[batch, prompt]`` (int64) in ``[0, vocab)`` on ``device``: the same prompt for
    every path and mode of one ``(batch, prompt)`` (a generator seeded by both)."""
    g = torch.Generator().manual_seed(batch * 7919 + prompt)
    return torch.randint(0, vocab, (batch, prompt), generator=g).to(device)
