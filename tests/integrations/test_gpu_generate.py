"""GPU: transformers' compiled static-cache ``generate`` of an ``FP8Linear`` model agrees with eager
``generate`` for 32 greedy tokens, on a Llama-shaped model built from a config (Llama-3.2-1B layer
shapes, 2 decoder layers, random weights: the bundled SmolLM2 is not on GPU machines).

What is checked, for each preset on the default backend (our sm90 kernel on an H100 / H200), for a
batch of 4 prompts:

- up to its first divergence, every sequence's compiled tokens are eager's, and at each of those
  steps the compiled logits differ from eager's (``calc_diff``) by less than FP8 differs from BF16 on
  the same prompt (``calc_diff`` of the eager FP8 and eager BF16 logits of the prompt): a compiled path
  that computed anything else (a wrong scale, a stale plan, a layout mix-up) would differ by O(1);
- the sequences that diverge do so where the eager logits of the two tokens are within that difference
  of each other (a near-tie: random weights give near-flat logits); the eager margins there are
  printed, and BF16's own compiled and eager runs (the same check, printed) show how often the model
  itself flips.

    python -m pytest tests/integrations/test_gpu_generate.py -q -s
"""

from __future__ import annotations

import pytest
import torch

from fp8_linear import FP8Linear

from fp8_models import swap_in_fp8
from helpers import calc_diff
from integ_helpers import random_ids

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

#: Llama-3.2-1B's linear shapes (hidden 2048, MLP 8192, 32 heads / 8 KV heads), 2 layers, a 32k vocabulary.
LLAMA_1B_SHAPED = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048,
                       tie_word_embeddings=False, rms_norm_eps=1e-5)
#: Widens the default init (std 0.02) as in test_gpu_from_pretrained.py.
GAIN = 2.0
NEW_TOKENS = 32
BATCH, PROMPT = 4, 16
#: Static presets: the calibrated input amax times this margin (generated tokens go past the prompt's range).
AMAX_MARGIN = 1.5
PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic"]


@pytest.fixture(scope="module")
def bf16_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_1B_SHAPED)).to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(GAIN)
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def prompts() -> torch.Tensor:
    return random_ids((BATCH, PROMPT), vocab=LLAMA_1B_SHAPED["vocab_size"], seed=5).cuda()


@pytest.fixture(scope="module")
def bf16_runs(bf16_model, prompts):
    """BF16's eager and compiled runs on the prompts (the reference of every preset)."""
    torch._dynamo.reset()
    runs = _generate(bf16_model, prompts, compiled=False), _generate(bf16_model, prompts, compiled=True)
    torch._dynamo.reset()
    return runs


def _fp8(model, preset: str, ids: torch.Tensor):
    """A copy of ``model`` with every decoder Linear as ``FP8Linear.from_linear`` (static presets calibrated on ``ids``)."""
    import copy

    return swap_in_fp8(copy.deepcopy(model), ids, preset, AMAX_MARGIN)


def _generate(model, ids, compiled: bool):
    """``(tokens [b, 32], logits: 32 x [b, V] fp32)`` of greedy ``generate`` (compiled static cache or eager)."""
    kw = dict(cache_implementation="static") if compiled else dict(disable_compile=True)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:].cpu(), [s.float().cpu() for s in out.logits]


def _agreement(eager, compiled) -> tuple[int, list[float], list[int]]:
    """Identical rows, the calc_diff of the logits at every step with a shared prefix, and each row's first divergence."""
    (e_tok, e_log), (c_tok, c_log) = eager, compiled
    diffs, first = [], []
    for r in range(e_tok.shape[0]):
        bad = (e_tok[r] != c_tok[r]).nonzero()
        last = int(bad[0]) if len(bad) else NEW_TOKENS - 1
        first.append(last if len(bad) else NEW_TOKENS)
        diffs += [calc_diff(c_log[p][r], e_log[p][r]) for p in range(last + 1)]
    return sum(f == NEW_TOKENS for f in first), diffs, first


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a CUDA GPU with FP8 (compute capability >= 8.9)")
@pytest.mark.parametrize("preset", PRESETS)
def test_compiled_greedy_tokens_agree_with_eager(bf16_model, prompts, bf16_runs, preset):
    ids = prompts
    ref_eager = bf16_runs[0]
    ref_same, ref_diffs, ref_first = _agreement(*bf16_runs)
    torch._dynamo.reset()
    model = _fp8(bf16_model, preset, ids)
    eager = _generate(model, ids, compiled=False)
    compiled = _generate(model, ids, compiled=True)
    same, diffs, first = _agreement(eager, compiled)
    torch._dynamo.reset()
    # the size of FP8's own effect on the logits: the prompt's logits (step 0, eager both), FP8 vs BF16
    fp8_effect = calc_diff(eager[1][0], ref_eager[1][0])
    # at a divergence, eager's margin between its token and the compiled one, in standard deviations of its logits
    margins = [round(float(eager[1][p][r][eager[0][r, p]] - eager[1][p][r][compiled[0][r, p]]) / float(eager[1][p][r].std()), 4)
               for r, p in enumerate(first) if p < NEW_TOKENS]
    backends = sorted({m.backend for m in model.modules() if isinstance(m, FP8Linear)})
    print(f"{preset} on {backends}: {same}/{BATCH} rows identical for {NEW_TOKENS} tokens (first divergences {first}, "
          f"eager margins there {margins} sd), compiled vs eager logits calc_diff <= {max(diffs):.3g}; FP8 vs BF16 "
          f"{fp8_effect:.3g}; BF16 itself: {ref_same}/{BATCH} rows identical (first divergences {ref_first}), "
          f"calc_diff <= {max(ref_diffs):.3g}")
    assert fp8_effect > 0
    assert max(diffs) < fp8_effect, (preset, max(diffs), fp8_effect)
