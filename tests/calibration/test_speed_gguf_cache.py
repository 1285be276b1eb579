"""The converted-GGUF cache of ``load_model``: the cached folder gives bitwise the logits and exactly
the token ids of a direct GGUF load (the session ``smollm2`` fixture), and loads fast."""

from __future__ import annotations

import time

import pytest
import torch

from fp8_linear import gguf_cache
from fp8_linear.calibration.data import corpus_text
from fp8_linear.models import load_model

#: A load from the converted folder on a 2-core CPU takes well under a second (a GGUF load ~30 s).
CACHED_LOAD_BAR_S = 10.0


def test_converted_copy_is_exact_and_fast(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(gguf_cache.SWITCH_ENV, raising=False)
    ref_model, ref_tok = smollm2
    load_model("smollm2")  # converts once
    (entry,) = (tmp_path / "gguf").iterdir()
    assert (entry / gguf_cache.MARKER).is_file() and (entry / gguf_cache.SAFETENSORS_NAME).is_file()
    t0 = time.perf_counter()
    model, tok = load_model("smollm2")
    assert time.perf_counter() - t0 < CACHED_LOAD_BAR_S
    assert type(model) is type(ref_model)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    text = corpus_text("eval")[:4000]
    ids = tok(text)["input_ids"]
    assert ids == ref_tok(text)["input_ids"] and tok.pad_token_id == ref_tok.pad_token_id
    x = torch.tensor([ids[:128]])
    with torch.inference_mode():
        assert torch.equal(model(input_ids=x).logits, ref_model(input_ids=x).logits)


def test_cache_switch_off_and_unwritable_root(smollm2_gguf, tmp_path, monkeypatch):
    folder, path = smollm2_gguf
    name = path.rsplit("/", 1)[-1]
    monkeypatch.setenv(gguf_cache.SWITCH_ENV, "0")
    assert gguf_cache.converted_folder(folder, name) == (folder, name)
    monkeypatch.delenv(gguf_cache.SWITCH_ENV)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocker))
    with pytest.warns(UserWarning, match="gguf cache: cannot write"):
        assert gguf_cache.converted_folder(folder, name) == (folder, name)
