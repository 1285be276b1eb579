"""quantize_model: module selection, every calib_data form, padding, NaN, empty data (tiny real models)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from fp8_linear import CalibrationError, FP8Linear, quantize_model
from fp8_linear.calibration import calibrate, select_linears
from fp8_linear.calibration.data import materialize_batches
from fp8_linear.formats import fmt_max

from calib_helpers import calc_diff

E4M3_MAX = fmt_max(torch.float8_e4m3fn)


def _lin_amax(model) -> float:
    return float(model.lin.input_scale) * E4M3_MAX


def _expected_amax(toy, rows) -> float:
    ids = torch.cat([torch.as_tensor(r).flatten() for r in rows])
    return float(toy.emb.weight.detach()[ids].abs().max())


ROWS = [torch.tensor([3, 5, 7, 9]), torch.tensor([11, 2]), torch.tensor([4, 4, 4, 4, 4, 6])]


@pytest.mark.parametrize("form", ["tensors", "batched_tensor", "lists", "dicts", "dataloader", "dataset_like"])
def test_every_token_form_gives_exact_amax(toy, form):
    if form == "tensors":
        data = ROWS
    elif form == "batched_tensor":
        data = torch.stack([torch.tensor([3, 5, 7, 9, 11, 2])])
    elif form == "lists":
        data = [r.tolist() for r in ROWS]
    elif form == "dicts":
        data = [{"input_ids": r, "attention_mask": torch.ones_like(r)} for r in ROWS]
    elif form == "dataloader":
        data = DataLoader([r[:2] for r in ROWS], batch_size=2)  # default collate -> [B, 2] tensors
    else:  # a datasets.Dataset yields row dicts of python lists; iterate one without the package
        data = [{"input_ids": r.tolist(), "attention_mask": [1] * len(r)} for r in ROWS]
    rows = {"batched_tensor": [torch.tensor([3, 5, 7, 9, 11, 2])], "dataloader": [r[:2] for r in ROWS]}.get(form, ROWS)
    expected = _expected_amax(toy, rows)
    quantize_model(toy, data, "fp8-tensor", progress=False)
    assert isinstance(toy.lin, FP8Linear)
    assert _lin_amax(toy) == pytest.approx(expected, rel=1e-6)


def test_hf_datasets_dataset(toy):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [r.tolist() for r in ROWS]})
    expected = _expected_amax(toy, ROWS)
    quantize_model(toy, ds, "fp8-tensor", progress=False)
    assert _lin_amax(toy) == pytest.approx(expected, rel=1e-6)


def test_strings_with_tokenizer(toy, word_tokenizer):
    texts = ["the cat of the hat", "it is what it is and that was that"]
    ids = [torch.tensor(word_tokenizer(t)["input_ids"]) for t in texts]
    expected = _expected_amax(toy, ids)
    quantize_model(toy, texts, "fp8-channel", tokenizer=word_tokenizer, progress=False)
    assert _lin_amax(toy) == pytest.approx(expected, rel=1e-6)


def test_padding_is_excluded(toy):
    pad = 63
    with torch.no_grad():
        toy.emb.weight[pad] = 1000.0  # would dominate the amax if padding leaked in
    ids = torch.tensor([[3, 5, pad, pad], [7, 9, 11, pad]])
    mask = (ids != pad).long()
    expected = _expected_amax(toy, [ids[mask.bool()]])
    quantize_model(toy, [{"input_ids": ids, "attention_mask": mask}], "fp8-tensor", progress=False)
    assert _lin_amax(toy) == pytest.approx(expected, rel=1e-6)
    assert _lin_amax(toy) < 100


def test_batched_with_padding_matches_unbatched_llama(tiny_llama):
    rows = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 12, 9, 16)]
    targets = select_linears(tiny_llama)
    padded = calibrate(tiny_llama, targets, materialize_batches(rows, batch_size=4), progress=False)
    single = calibrate(tiny_llama, targets, materialize_batches(rows, batch_size=1), progress=False)
    for name in targets:
        assert padded[name].count == single[name].count
        assert padded[name].max == pytest.approx(single[name].max, rel=1e-5), name


def test_nan_activation_names_layer(toy):
    with torch.no_grad():
        toy.emb.weight[5] = float("nan")
    with pytest.raises(CalibrationError, match="'lin'"):
        quantize_model(toy, [torch.tensor([1, 5, 2])], "fp8-tensor", progress=False)


@pytest.mark.parametrize("data", [[], [{"input_ids": torch.tensor([1, 2]), "attention_mask": torch.tensor([0, 0])}]])
def test_empty_or_all_padding_raises(toy, data):
    with pytest.raises(CalibrationError):
        quantize_model(toy, data, "fp8-tensor", progress=False)


def test_no_linear_raises():
    with pytest.raises(ValueError, match="nn.Linear"):
        quantize_model(nn.Sequential(nn.Embedding(4, 4), nn.ReLU()), [torch.tensor([1])], "fp8-tensor", progress=False)


def test_ignore_patterns_and_unmatched_warning(tiny_llama):
    ignore = ("lm_head", "re:model\\.layers\\.0\\.mlp\\..*", "model.layers.1.self_attn.o_proj", "re:nothing\\.here")
    with pytest.warns(UserWarning, match="nothing"):
        quantize_model(tiny_llama, [torch.arange(10)], "fp8-channel", ignore=ignore, progress=False)
    kept = {n for n, m in tiny_llama.named_modules() if type(m) is nn.Linear}
    assert kept == {"lm_head", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
                    "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj"}
    assert sum(isinstance(m, FP8Linear) for m in tiny_llama.modules()) == 14 - 4


#: Bad ``ignore`` values: the error type every entry point raises and a part of its message.
BAD_IGNORE = [
    (5, TypeError, "expected a list of module names or 're:' patterns (strings), got 5"),
    ([1], TypeError, "expected module names or 're:' patterns (non-empty strings), got [1]"),
    (["lm_head", ""], TypeError, "(non-empty strings), got ['lm_head', '']"),
    ([nn.Linear], TypeError, "(non-empty strings), got [<class 'torch.nn.modules.linear.Linear'>]"),
    (["re:(unclosed"], ValueError, "'re:(unclosed' is not a valid regular expression (missing )"),
    (["lm_head", "re:a{2,1}"], ValueError, "'re:a{2,1}' is not a valid regular expression (min repeat greater"),
]


@pytest.mark.parametrize("bad, err, needle", BAD_IGNORE)
def test_ignore_refused_alike_by_every_entry_point(toy, bad, err, needle):
    """quantize_model, FP8LinearConfig, quantize_fused_experts and the CLI's ``--ignore`` refuse one bad
    ``ignore`` with one typed error naming the argument (the CLI: its flag), before touching the model."""
    from fp8_linear import FP8LinearConfig
    from fp8_linear.cli.common import CLIError
    from fp8_linear.cli.quantize_cmd import check_ignore
    from fp8_linear.moe.convert import quantize_fused_experts

    calls = [lambda: quantize_model(toy, ROWS, "fp8-tensor", ignore=bad, progress=False),
             lambda: FP8LinearConfig(ignore=bad),
             lambda: quantize_fused_experts(toy, "fp8-dynamic", ignore=bad)]
    for call in calls:
        with pytest.raises(err) as e:
            call()
        assert str(e.value).startswith("ignore: ") and needle in str(e.value), str(e.value)
    with pytest.raises(CLIError) as e:
        check_ignore(bad)
    assert str(e.value).startswith("--ignore: ") and needle in str(e.value), str(e.value)
    assert type(toy.lin) is nn.Linear


def test_regex_only_ignore_syntax_refused_only_where_re_match_reads_it(toy):
    """``re:\\p{L}``: the ``regex`` engine (FP8LinearConfig, fused experts) compiles it, Python's ``re``
    (quantize_model's Linear selection, so the CLI) does not."""
    from fp8_linear import FP8LinearConfig
    from fp8_linear.cli.common import CLIError
    from fp8_linear.cli.quantize_cmd import check_ignore
    from fp8_linear.moe.convert import select_fused_experts

    pat = "re:\\p{L}+_proj$"
    assert FP8LinearConfig(ignore=pat).ignore == [pat] and select_fused_experts(toy, pat) == {}
    with pytest.raises(ValueError, match="is not a valid regular expression .bad escape"):
        quantize_model(toy, ROWS, "fp8-tensor", ignore=[pat], progress=False)
    with pytest.raises(CLIError, match="^--ignore: .*bad escape"):
        check_ignore([pat])


def test_tied_lm_head_skipped_and_untouched(tiny_llama):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # default ignore on a model with lm_head: no warning
        quantize_model(tiny_llama, [torch.arange(10)], "fp8-tensor", ignore=(), progress=False)
    assert type(tiny_llama.lm_head) is nn.Linear
    assert tiny_llama.lm_head.weight is tiny_llama.model.embed_tokens.weight


@pytest.mark.parametrize("scheme", ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"])
def test_every_preset_close_to_unquantized(tiny_llama, scheme):
    x = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = tiny_llama(x).logits
    q = quantize_model(copy.deepcopy(tiny_llama), [torch.randint(0, 64, (24,)) for _ in range(4)], scheme, progress=False)
    with torch.inference_mode():
        out = q(x).logits
    assert sum(isinstance(m, FP8Linear) for m in q.modules()) == 14
    assert calc_diff(out, ref) < 1e-3


def test_dynamic_scheme_needs_no_data(tiny_llama):
    quantize_model(tiny_llama, None, "fp8-dynamic", progress=False)  # no tokenizer needed: nothing to calibrate
    assert isinstance(tiny_llama.model.layers[0].mlp.up_proj, FP8Linear)
