"""Bad command-line inputs: each ends in one line ``fp8-linear <command>: error: ...`` naming the flag or
file, exit code 1, no traceback, and (for inputs the command can check alone) before any model loads."""

from __future__ import annotations

import json
import os

import pytest

import fp8_linear.models
from fp8_linear.cli import EXIT_ERROR, main


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if the command gets as far as loading a model."""
    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(fp8_linear.models, "load_model", refuse)


def one_error_line(capsys, command: str, *needles: str) -> str:
    """The single stderr line of a failed run: ``fp8-linear <command>: error: ...`` holding every needle."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith(f"fp8-linear {command}: error: "), err
    assert len([ln for ln in lines if ": error: " in ln]) == 1, err
    for n in needles:
        assert n in lines[-1], (n, lines[-1])
    return lines[-1]


@pytest.mark.parametrize("argv, flag", [
    (["eval", "--seq-len", "0"], "--seq-len"),
    (["eval", "--windows", "0"], "--windows"),
    (["compare", "--windows", "0"], "--windows"),
    (["compare", "--eval-seq-len", "-3"], "--eval-seq-len"),
    (["quantize", "-o", "x", "--samples", "0"], "--samples"),
    (["quantize", "-o", "x", "--seq-len", "0"], "--seq-len"),
    (["quantize", "-o", "x", "--batch-size", "-1"], "--batch-size"),
    (["quantize", "-o", "x", "--threads", "-2"], "--threads"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
])
def test_non_positive_numbers_name_the_flag(argv, flag, capsys, no_model_load):
    assert main(argv) == EXIT_ERROR
    one_error_line(capsys, argv[0], flag)


def test_windows_zero_is_not_reported_as_empty_text(capsys, no_model_load):
    assert main(["eval", "--windows", "0"]) == EXIT_ERROR
    line = one_error_line(capsys, "eval", "--windows", "positive")
    assert "empty" not in line


def test_output_naming_a_file(tmp_path, capsys, no_model_load):
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert main(["quantize", "-o", str(f)]) == EXIT_ERROR
    one_error_line(capsys, "quantize", "-o/--output", "file.txt", "is a file")
    assert main(["compare", "-o", str(f)]) == EXIT_ERROR
    one_error_line(capsys, "compare", "-o/--output", "is a file")


def test_output_folder_not_empty_needs_overwrite(tmp_path, capsys, no_model_load):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    assert main(["quantize", "-o", str(tmp_path / "out")]) == EXIT_ERROR
    one_error_line(capsys, "quantize", "-o/--output", "--overwrite")
    # --overwrite replaces a checkpoint, never a folder of someone's files
    assert main(["quantize", "-o", str(tmp_path / "out"), "--overwrite"]) == EXIT_ERROR
    one_error_line(capsys, "quantize", "-o/--output", "no checkpoint")
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_output_under_a_file(tmp_path, capsys, no_model_load):
    (tmp_path / "f").write_text("x")
    assert main(["quantize", "-o", str(tmp_path / "f" / "sub")]) == EXIT_ERROR
    one_error_line(capsys, "quantize", "-o/--output", "is a file")


def test_checkpoints_folder_of_other_files(tmp_path, capsys, no_model_load):
    (tmp_path / "ck" / "fp8-tensor").mkdir(parents=True)
    (tmp_path / "ck" / "fp8-tensor" / "keep.txt").write_text("mine")
    assert main(["compare", "--schemes", "fp8-tensor", "--checkpoints", str(tmp_path / "ck"), "-o", str(tmp_path / "o")]) == EXIT_ERROR
    one_error_line(capsys, "compare", "--checkpoints", "no checkpoint")


def test_repeated_scheme(capsys, no_model_load):
    assert main(["compare", "--schemes", "fp8-tensor", "fp8-tensor"]) == EXIT_ERROR
    one_error_line(capsys, "compare", "--schemes", "fp8-tensor")


@pytest.mark.parametrize("flag, argv", [
    ("--data", ["eval", "--data", "{}"]),
    ("--calib", ["quantize", "-o", "OUT", "--calib", "{}"]),
    ("--model", ["quantize", "-o", "OUT", "--model", "{}"]),
    ("-o/--output", ["quantize", "-o", "{}"]),
    ("MODEL", ["eval", "{}"]),
    ("--json", ["eval", "--json", "{}"]),
    ("CHECKPOINT", ["inspect", "{}"]),
])
def test_300_character_path(flag, argv, tmp_path, capsys, no_model_load):
    long = str(tmp_path / ("n" * 300))
    argv = [long if a == "{}" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == EXIT_ERROR
    one_error_line(capsys, argv[0], flag, "300 bytes long")


def test_missing_files_name_flag_and_path(tmp_path, capsys, no_model_load):
    assert main(["eval", "--data", str(tmp_path / "gone.txt")]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--data", "gone.txt", "does not exist")
    assert main(["eval", "--reference", str(tmp_path / "ref")]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--reference", "does not exist")
    assert main(["generate", str(tmp_path / "m.bin"), "--prompt", "x"]) == EXIT_ERROR
    one_error_line(capsys, "generate", "MODEL", "m.bin")


def test_folder_without_config_as_model(tmp_path, capsys, no_model_load):
    (tmp_path / "m").mkdir()
    assert main(["eval", str(tmp_path / "m")]) == EXIT_ERROR
    one_error_line(capsys, "eval", "MODEL", "config.json")
    (tmp_path / "m" / "config.json").write_text("{not json")
    assert main(["eval", str(tmp_path / "m")]) == EXIT_ERROR
    one_error_line(capsys, "eval", "MODEL", "config.json", "JSON")


def test_binary_calibration_file_is_named(tmp_path, capsys, no_model_load):
    b = tmp_path / "weights.bin"
    b.write_bytes(bytes(range(256)) * 4)
    assert main(["quantize", "-o", str(tmp_path / "o"), "--calib", str(b)]) == EXIT_ERROR
    one_error_line(capsys, "quantize", "--calib", "weights.bin", "binary")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    assert main(["quantize", "-o", str(tmp_path / "o"), "--calib", str(latin)]) == EXIT_ERROR
    one_error_line(capsys, "quantize", "--calib", "latin1.txt", "UTF-8", "offset 3")


def test_data_folder_that_is_not_a_dataset(tmp_path, capsys, no_model_load):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("hello")
    assert main(["eval", "--data", str(tmp_path / "d")]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--data", "save_to_disk")


@pytest.mark.parametrize("lines, line_no, needle", [
    (['{"text": "a b"}', "7"], 2, "got a number"),
    (['{"text": "a b"}', "", "", '"just a string"'], 4, "got a string"),
    (['{"text": "a"}', "{bad json"], 2, "not valid JSON"),
    (['{"text": "a"}', '{"input_ids": [1, 2]}'], 2, "use one field"),
    (['{"input_ids": [1, "x"]}'], 1, "integers only"),
    (['{"input_ids": [1, -4]}'], 1, "negative token id -4"),
    (['{"input_ids": [1, 2], "attention_mask": [1]}'], 1, "attention_mask"),
    (['{"text": 5}'], 1, "must be a string"),
    (["", '{"prompt": "x"}'], 2, "'text' or 'input_ids'"),
    (["[1, 2, 3]"], 1, "got a list"),
])
def test_jsonl_errors_give_the_file_line(lines, line_no, needle, tmp_path, capsys, no_model_load):
    f = tmp_path / "data.jsonl"
    f.write_text("\n".join(lines) + "\n")
    assert main(["eval", "--data", str(f)]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--data", "data.jsonl", f"line {line_no}:", needle)


def test_empty_text_and_jsonl(tmp_path, capsys, no_model_load):
    (tmp_path / "e.txt").write_text("\n\n  \n")
    assert main(["eval", "--data", str(tmp_path / "e.txt")]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--data", "e.txt", "empty")
    (tmp_path / "e.jsonl").write_text("\n\n")
    assert main(["eval", "--data", str(tmp_path / "e.jsonl")]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--data", "no JSON lines")


def test_bad_ignore_regex(capsys, no_model_load):
    assert main(["quantize", "-o", "x", "--ignore", "re:(unclosed"]) == EXIT_ERROR
    one_error_line(capsys, "quantize", "--ignore", "re:(unclosed")


def test_empty_prompt(capsys, no_model_load):
    assert main(["generate", "--prompt", "   "]) == EXIT_ERROR
    one_error_line(capsys, "generate", "--prompt")


# ------------------------------------------------------------------ errors found after loading (tiny models)
def test_one_word_eval_file(tiny_llama_dir, tmp_path, capsys):
    f = tmp_path / "one.txt"
    f.write_text("the\n")
    assert main(["eval", str(tiny_llama_dir), "--data", str(f), "-q"]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--data", "at least 2")


def test_one_word_eval_file_fails_compare_before_calibrating(tiny_llama_dir, tmp_path, capsys, monkeypatch):
    import fp8_linear.calibration.compare as compare

    def refuse(*a, **k):
        raise AssertionError("calibrated before the eval data was checked")

    monkeypatch.setattr(compare, "calibrate", refuse)
    f = tmp_path / "one.txt"
    f.write_text("the")
    assert main(["compare", "--model", str(tiny_llama_dir), "--data", str(f), "-o", str(tmp_path / "o"), "-q"]) == EXIT_ERROR
    one_error_line(capsys, "compare", "--data", "at least 2")


def test_reference_with_another_vocabulary(tiny_llama_dir, tmp_path, capsys):
    from calib_helpers import make_word_tokenizer, tiny_llama_config
    from transformers import LlamaForCausalLM

    other = tmp_path / "other"
    LlamaForCausalLM(tiny_llama_config(vocab_size=80)).save_pretrained(other)
    make_word_tokenizer().save_pretrained(other)
    assert main(["eval", str(tiny_llama_dir), "--reference", str(other), "--windows", "1", "-q"]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--reference", "vocabulary", "80", "64")


def test_seq_len_beyond_the_model_positions(tiny_llama_dir, text_file, capsys):
    assert main(["eval", str(tiny_llama_dir), "--data", str(text_file), "--seq-len", "4096", "-q"]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--seq-len", "128 positions")


def test_generate_needs_a_causal_lm(tmp_path, capsys):
    from transformers import BertConfig, BertModel

    d = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(d)
    assert main(["generate", str(d), "--prompt", "hello", "-q"]) == EXIT_ERROR
    one_error_line(capsys, "generate", "MODEL", "not a causal LM")


def test_generate_past_the_model_positions(tiny_llama_dir, capsys):
    assert main(["generate", str(tiny_llama_dir), "--prompt", "the cat", "-n", "500", "-q"]) == EXIT_ERROR
    one_error_line(capsys, "generate", "--max-new-tokens", "128 positions")


def test_model_without_linear_layers_names_the_model(tiny_gpt2_dir, text_file, tmp_path, capsys):
    assert main(["quantize", "--model", str(tiny_gpt2_dir), "--calib", str(text_file), "-o", str(tmp_path / "o"), "-q"]) == EXIT_ERROR
    one_error_line(capsys, "quantize", "--model", "nn.Linear")
    assert not os.path.exists(tmp_path / "o")


def test_unexpected_error_is_one_line(tiny_llama_dir, tmp_path, capsys):
    """A config transformers cannot build a model from: still one line, with the library's reason."""
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.loads((tiny_llama_dir / "config.json").read_text())
    cfg["num_attention_heads"] = 0
    (bad / "config.json").write_text(json.dumps(cfg))
    assert main(["eval", str(bad), "-q"]) == EXIT_ERROR
    one_error_line(capsys, "eval")


# ------------------------------------------------------------------ inspect on odd folders
def _shard(path, header: bytes, data: bytes = b"") -> None:
    import struct

    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize("make, needles", [
    (lambda d: (d / "x.safetensors").write_bytes(b"\x01\x02"), ("truncated",)),
    (lambda d: _shard(d / "x.safetensors", b"[1, 2]"), ("JSON list",)),
    (lambda d: _shard(d / "x.safetensors", b"{not json"), ("not JSON",)),
    (lambda d: _shard(d / "x.safetensors", b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}', b"\0" * 8),
     ("'w'", "data_offsets")),
    (lambda d: _shard(d / "x.safetensors", b'{"w": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}}', b"\0" * 8),
     ("'w'", "shape")),
    (lambda d: _shard(d / "x.safetensors", b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', b"\0" * 8),
     ("'w'", "inside the 8 data bytes")),
    (lambda d: _shard(d / "x.safetensors", b'{"w": "F32"}'), ("'w'", "dtype")),
    (lambda d: (d / "y.safetensors").mkdir(), ("no .safetensors files", "not regular files")),
    (lambda d: os.mkfifo(d / "z.safetensors"), ("no .safetensors files", "not regular files")),
    (lambda d: None, ("no .safetensors files",)),
])
def test_inspect_odd_folders(make, needles, tmp_path, capsys):
    d = tmp_path / "ckpt"
    d.mkdir()
    make(d)
    assert main(["inspect", str(d)]) == EXIT_ERROR
    one_error_line(capsys, "inspect", "CHECKPOINT", *needles)


def test_inspect_odd_configs(tmp_path, capsys):
    d = tmp_path / "ckpt"
    d.mkdir()
    _shard(d / "model.safetensors", b'{"w": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [0, 4]}}', b"\0" * 4)
    (d / "config.json").write_text("[1, 2]")
    assert main(["inspect", str(d)]) == EXIT_ERROR
    one_error_line(capsys, "inspect", "config.json", "JSON list")
    (d / "config.json").write_bytes(b"\xff\xfe")
    assert main(["inspect", str(d)]) == EXIT_ERROR
    one_error_line(capsys, "inspect", "config.json")
    # fields of the wrong type are reported as they are, not crashed on
    (d / "config.json").write_text(json.dumps({"architectures": "Llama", "quantization_config": ["fp8"]}))
    assert main(["inspect", str(d)]) == 0
    assert "not an object" in capsys.readouterr().out
    (d / "config.json").write_text(json.dumps({"quantization_config": {"config_groups": {"g": ["x"]}, "ignore": 3}}))
    assert main(["inspect", str(d), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "F8_E4M3" in out and "g: targets=None" in out


def test_inspect_a_file(tmp_path, capsys):
    (tmp_path / "f.safetensors").write_bytes(b"12345678")
    assert main(["inspect", str(tmp_path / "f.safetensors")]) == EXIT_ERROR
    one_error_line(capsys, "inspect", "CHECKPOINT", "is a file")


def test_encoder_alone_needs_a_reference(tmp_path, capsys):
    from transformers import BertConfig, BertModel

    d = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(d)
    assert main(["eval", str(d), "-q"]) == EXIT_ERROR
    one_error_line(capsys, "eval", "--reference", "encoder")


def test_stdlib_names_the_second_bundled_text(tmp_path, monkeypatch):
    """``--data stdlib`` is the paragraphs of the standard-library docstrings text, exactly what a .txt file of
    that text reads as (so results name its digest, docs/calibration.md), even beside a file named ``stdlib``."""
    from fp8_linear.calibration.stdlib_text import stdlib_text
    from fp8_linear.cli.data import read_data

    (tmp_path / "stdlib.txt").write_text(stdlib_text(), encoding="utf-8")
    (tmp_path / "stdlib").write_text("a file that the name does not read", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    paras = read_data("stdlib", "--data")
    assert paras == read_data(str(tmp_path / "stdlib.txt"), "--data")
    assert len(paras) > 1000 and all(p and p == p.strip() and "\n\n" not in p for p in paras)
