"""The fp8-linear CLI on tiny real models: exit codes, files written, clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from fp8_linear.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, inspect_checkpoint, main


@pytest.fixture
def checkpoint(tiny_fp8_checkpoint):
    return tiny_fp8_checkpoint


def test_quantize_writes_a_compressed_tensors_checkpoint(checkpoint):
    assert (checkpoint / "config.json").is_file() and list(checkpoint.glob("*.safetensors"))
    cfg = json.loads((checkpoint / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    assert (checkpoint / "tokenizer.json").is_file()


def test_inspect_lists_fp8_tensors(checkpoint, capsys):
    assert main(["inspect", str(checkpoint), "--tensors"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "F8_E4M3" in out and "model.layers.0.self_attn.q_proj.weight_scale" in out
    info = inspect_checkpoint(checkpoint)
    fp8 = [t for t in info["tensors"] if t["dtype"] == "F8_E4M3"]
    assert len(fp8) == 14  # 2 layers x 7 Linear
    q = next(t for t in fp8 if t["name"] == "model.layers.0.mlp.up_proj.weight")
    assert q["shape"] == [64, 32] and q["bytes"] == 64 * 32
    scales = [t for t in info["tensors"] if t["name"].endswith("weight_scale")]
    assert all(t["shape"][1:] == [1] and t["dtype"] == "F32" for t in scales)


def test_eval_against_reference(checkpoint, tiny_llama_dir, text_file, tmp_path, capsys):
    js = tmp_path / "m.json"
    rc = main(["eval", str(checkpoint), "--reference", str(tiny_llama_dir), "--data", str(text_file),
               "--windows", "2", "--seq-len", "64", "--json", str(js), "-q"])
    assert rc == EXIT_OK
    m = json.loads(js.read_text())
    assert m["model"]["top1_agreement"] > 0.9 and m["model"]["kl"] < 1e-2
    assert m["model"]["perplexity"] == pytest.approx(m["reference"]["perplexity"], rel=0.02)


def test_compare_writes_table_and_plots(tiny_llama_dir, text_file, tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", "--model", str(tiny_llama_dir), "--schemes", "fp8-tensor", "fp8-channel", "fp8-dynamic",
               "--calib", str(text_file), "--data", str(text_file), "--samples", "8", "--seq-len", "32",
               "--windows", "2", "--eval-seq-len", "64", "-o", str(out), "-q"])
    assert rc == EXIT_OK
    printed = capsys.readouterr().out
    assert "unquantized-fp32" in printed and "fp8-channel" in printed
    for f in ("comparison.md", "comparison.csv", "comparison.json", "comparison_sqnr.png", "comparison_ppl.png"):
        assert (out / f).stat().st_size > 0, f
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert [r["scheme"] for r in rows] == ["unquantized-fp32", "fp8-tensor", "fp8-channel", "fp8-dynamic"]
    assert all(r["checkpoint_mb"] > 0 for r in rows[1:])  # evaluated after save + reload


def test_missing_model_file(tmp_path, capsys):
    rc = main(["quantize", "--model", str(tmp_path / "nope"), "-o", str(tmp_path / "o"), "-q"])
    assert rc == EXIT_ERROR
    err = capsys.readouterr().err
    assert "does not exist" in err and "nope" in err


def test_missing_data_file(tiny_llama_dir, tmp_path, capsys):
    rc = main(["quantize", "--model", str(tiny_llama_dir), "--calib", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "o"), "-q"])
    assert rc == EXIT_ERROR
    assert "missing.txt" in capsys.readouterr().err


def test_unknown_preset_is_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["quantize", "--scheme", "fp8-magic", "-o", str(tmp_path / "o")])
    assert e.value.code == EXIT_USAGE
    assert "fp8-magic" in capsys.readouterr().err


def test_model_without_linear_layers(tiny_gpt2_dir, text_file, tmp_path, capsys):
    rc = main(["quantize", "--model", str(tiny_gpt2_dir), "--calib", str(text_file), "-o", str(tmp_path / "o"), "-q"])
    assert rc == EXIT_ERROR
    assert "nn.Linear" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_jsonl_calibration_data(tiny_llama_dir, tmp_path):
    js = tmp_path / "calib.jsonl"
    js.write_text("\n".join(json.dumps({"input_ids": list(range(2, 20))}) for _ in range(3)))
    rc = main(["quantize", "--model", str(tiny_llama_dir), "--scheme", "fp8-tensor", "--calib", str(js), "-o", str(tmp_path / "o"), "-q"])
    assert rc == EXIT_OK


def test_dataset_folder(tiny_llama_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["the cat is on the mat"] * 4}).save_to_disk(str(tmp_path / "ds"))
    rc = main(["quantize", "--model", str(tiny_llama_dir), "--calib", str(tmp_path / "ds"), "-o", str(tmp_path / "o"), "-q"])
    assert rc == EXIT_OK


def test_inspect_missing_and_truncated(checkpoint, tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "none")]) == EXIT_ERROR
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint, bad)
    shard = next(bad.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:4])
    assert main(["inspect", str(bad)]) == EXIT_ERROR
    assert "truncated" in capsys.readouterr().err


def test_help_runs_as_console_script():
    exe = shutil.which("fp8-linear")
    cmd = [exe] if exe else [sys.executable, "-m", "fp8_linear.cli"]
    r = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "fp8-linear compare" in r.stdout and "fp8-channel" in r.stdout
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_USAGE


def test_encoder_quantize_and_eval_against_its_reference(text_file, tmp_path, capsys):
    from calib_helpers import make_word_tokenizer
    from transformers import BertConfig, BertModel

    ref = tmp_path / "bert"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(ref)
    make_word_tokenizer().save_pretrained(ref)
    out = tmp_path / "bert-fp8"
    assert main(["quantize", "--model", str(ref), "--scheme", "fp8-dynamic", "--calib", str(text_file), "--samples", "4",
                 "--seq-len", "32", "-o", str(out), "-q"]) == EXIT_OK
    js = tmp_path / "m.json"
    assert main(["eval", str(out), "--reference", str(ref), "--data", str(text_file), "--json", str(js), "-q"]) == EXIT_OK
    m = json.loads(js.read_text())["model"]
    assert 0.99 < m["embedding_cosine"] <= 1.0 + 1e-9 and "perplexity" not in m
