"""Calibration inputs checked against the model they feed (``materialize_batches(..., model=...)``):
token ids outside the vocabulary refused with the id and position, ragged unpadded batches padded,
samples longer than the model's positions cut with a warning, a model on the meta device refused."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_models import TINY_LLAMA, VOCAB, tiny_llama

from fp8_linear.calibration.data import materialize_batches, model_limits

POSITIONS = TINY_LLAMA["max_position_embeddings"]


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def test_limits_of_a_real_model(model):
    limits = model_limits(model)
    assert (limits.vocab_size, limits.max_positions) == (VOCAB, POSITIONS)


@pytest.mark.parametrize("ids,bad,pos", [([3, VOCAB, 5], VOCAB, 1), ([4, 2, -1], -1, 2), ([VOCAB + 1000], VOCAB + 1000, 0)])
def test_token_ids_outside_the_vocabulary_are_refused(model, ids, bad, pos):
    with pytest.raises(ValueError, match=rf"calib_data: expected token ids in \[0, {VOCAB}\) .*got {bad} at position {pos}"):
        materialize_batches([torch.tensor(ids)], model=model)


def test_negative_ids_are_refused_without_a_model():
    with pytest.raises(ValueError, match=r"expected token ids in >= 0 .*got -3 at position 1"):
        materialize_batches([torch.tensor([1, -3])])


def test_out_of_range_ids_under_padding_are_zeroed(model):
    """Padding positions are embedded too: their ids must be valid, whatever the mask hides."""
    (batch,) = materialize_batches([{"input_ids": torch.tensor([[5, 6, -100, VOCAB + 3]]),
                                     "attention_mask": torch.tensor([[1, 1, 0, 0]])}], model=model)
    assert batch.input_ids.tolist() == [[5, 6, 0, 0]] and batch.num_tokens == 2
    with torch.no_grad():
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)


def test_ragged_unpadded_batch_is_padded(model):
    (batch,) = materialize_batches([{"input_ids": [[1, 2, 3], [4, 5]]}], model=model)
    assert batch.input_ids.tolist() == [[1, 2, 3], [4, 5, 0]]  # right-padded with id 0 (no tokenizer)
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_ragged_batch_with_ragged_mask(model):
    (batch,) = materialize_batches([{"input_ids": [[1, 2, 3], [4, 5]], "attention_mask": [[1, 1, 0], [1, 1]]}], model=model)
    assert batch.num_tokens == 4


def test_ragged_mask_that_disagrees_is_refused(model):
    with pytest.raises(ValueError, match="attention_mask: expected row 1 of length 2 .*got 3"):
        materialize_batches([{"input_ids": [[1, 2, 3], [4, 5]], "attention_mask": [[1, 1, 1], [1, 1, 1]]}], model=model)


def test_samples_longer_than_the_positions_are_cut_with_a_warning(model, caplog):
    ids = torch.arange(POSITIONS + 40) % VOCAB
    with caplog.at_level(logging.WARNING, logger="fp8_linear.calibration.data"):
        batches = materialize_batches([ids], model=model, seq_len=POSITIONS * 2)
    assert batches[0].input_ids.shape == (1, POSITIONS)
    assert f"cut to {POSITIONS}, the model's max_position_embeddings" in caplog.text
    with torch.no_grad():
        model(input_ids=batches[0].input_ids)


def test_meta_model_is_refused():
    from accelerate import init_empty_weights

    with init_empty_weights():
        meta = tiny_llama()
    with pytest.raises(ValueError, match="model: expected a model with real weights, got .* on the meta device"):
        materialize_batches([torch.tensor([1, 2])], model=meta)


def test_meta_token_ids_are_refused(model):
    with pytest.raises(ValueError, match="input_ids: expected token ids with values, got a tensor on the meta device"):
        materialize_batches([torch.empty(4, dtype=torch.long, device="meta")], model=model)
