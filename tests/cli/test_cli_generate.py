"""``fp8-linear generate``: the text printed is transformers' own greedy generation of the same model
(the bundled SmolLM2 on CPU, and a saved FP8 checkpoint), and the speed line reports tokens/s."""

from __future__ import annotations

import re

import pytest
import torch

from fp8_linear.cli import EXIT_OK, main
from fp8_linear.cli.generate_cmd import speed_line

PROMPT = "The Python with statement"
NEW_TOKENS = 4
SPEED = re.compile(r"^(\d+) new tokens in [\d.]+ s \(([\d.]+) tokens/s")


def greedy_text(model, tok, prompt: str, n: int) -> str:
    """Prompt + ``n`` greedy tokens, decoded: what ``generate`` must print (transformers' generate, run here)."""
    ids = tok(prompt, return_tensors="pt").input_ids
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=pad)
    return tok.decode(out[0], skip_special_tokens=True)


def _speed(err: str) -> re.Match:
    m = next((SPEED.match(ln) for ln in err.splitlines() if SPEED.match(ln)), None)
    assert m, err
    return m


@pytest.mark.slow
def test_generate_on_the_bundled_model(capsys):
    from fp8_linear.models import load_model

    assert main(["generate", "smollm2", "--prompt", PROMPT, "-n", str(NEW_TOKENS), "-q", "--threads", "2"]) == EXIT_OK
    cap = capsys.readouterr()
    model, tok = load_model("smollm2")
    assert cap.out.strip() == greedy_text(model, tok, PROMPT, NEW_TOKENS).strip()
    m = _speed(cap.err)
    assert int(m.group(1)) == NEW_TOKENS and float(m.group(2)) > 0


def test_generate_from_an_fp8_checkpoint(tiny_fp8_checkpoint, capsys):
    from fp8_linear import FP8Linear, load_quantized
    from transformers import AutoTokenizer

    prompt = "the cat is on"
    assert main(["generate", str(tiny_fp8_checkpoint), "--prompt", prompt, "-n", "6", "-q"]) == EXIT_OK
    cap = capsys.readouterr()
    model = load_quantized(tiny_fp8_checkpoint, dtype=torch.float32).eval()
    assert any(isinstance(m, FP8Linear) for m in model.modules())
    tok = AutoTokenizer.from_pretrained(tiny_fp8_checkpoint)
    assert cap.out.strip() == greedy_text(model, tok, prompt, 6).strip()
    _speed(cap.err)


def test_generate_chat_prints_only_the_reply(tiny_llama_dir, tmp_path, capsys):
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = tmp_path / "chat"
    shutil.copytree(tiny_llama_dir, d)
    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = "{% for m in messages %}<{{ m['content'] }}> {% endfor %}to"
    tok.save_pretrained(d)
    assert main(["generate", str(d), "--prompt", "a is", "-n", "3", "--chat", "-q"]) == EXIT_OK
    ids = tok.apply_chat_template([{"role": "user", "content": "a is"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    assert capsys.readouterr().out.strip() == tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def test_speed_line():
    assert speed_line(0, 0.0, []).startswith("no new tokens")
    line = speed_line(3, 10.0, [10.5, 11.0, 11.5])
    assert line == "3 new tokens in 1.50 s (2.00 tokens/s; first token after 0.50 s, then 2.00 tokens/s)"
