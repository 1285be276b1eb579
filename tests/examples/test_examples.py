"""Every example runs on the bundled SmolLM2 on a CPU (a few tokens each), as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Generous: an emulated FP8 SmolLM2 on a busy 2-core CPU.
TIMEOUT_S = 1800
NEW_TOKENS = "4"


def run_example(name: str, *args, cwd) -> str:
    """Run ``examples/<name>`` with ``args`` in ``cwd``; its stdout (fails with the stderr tail on exit != 0)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *map(str, args)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert out.returncode == 0, f"{name} exited {out.returncode}:\n{out.stderr[-4000:]}"
    return out.stdout


def need_smollm2() -> None:
    """Skip when the bundled model's package is not installed (found, never imported: it imports llama_cpp)."""
    from fp8_linear.models import bundled_path

    try:
        bundled_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smollm2_from_pretrained(tmp_path_factory):
    """``(stdout, checkpoint)`` of ``from_pretrained.py --output``: the bundled model quantized on load and saved."""
    need_smollm2()
    tmp = tmp_path_factory.mktemp("from_pretrained")
    ckpt = tmp / "smollm2-fp8"
    return run_example("from_pretrained.py", "--max-new-tokens", NEW_TOKENS, "--output", ckpt, cwd=tmp), ckpt


def test_quickstart(tmp_path):
    need_smollm2()
    out = run_example("quickstart.py", "--samples", "2", "--max-new-tokens", NEW_TOKENS, "--output", tmp_path / "q",
                      cwd=tmp_path)
    assert "FP8Linear(" in out and "scheme=fp8-channel" in out
    assert "The Python statement `with` is used to" in out
    qc = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"


def test_from_pretrained(smollm2_from_pretrained):
    out, ckpt = smollm2_from_pretrained
    assert "FP8Linear(" in out and "scheme=fp8-dynamic" in out
    assert "reloaded with load_quantized: same tokens" in out
    qc = json.loads((ckpt / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["ignore"] == ["lm_head"]


def test_serve_pretrained_our_checkpoint(smollm2_from_pretrained, tmp_path):
    _, ckpt = smollm2_from_pretrained
    out = run_example("serve_pretrained.py", ckpt, "--max-new-tokens", NEW_TOKENS, cwd=tmp_path)
    assert "format compressed-tensors: 210 FP8Linear layers (210 x fp8-dynamic)" in out
    assert "The Python statement `with` is used to" in out


@pytest.mark.parametrize("fixture", ["FP8", "FP8_DYNAMIC", "FP8_BLOCK"])
def test_serve_pretrained_llmcompressor(fixture, tmp_path):
    """Checkpoints llm-compressor wrote (tests/fixtures/llmcompressor); they carry no tokenizer."""
    out = run_example("serve_pretrained.py", os.path.join(ROOT, "tests", "fixtures", "llmcompressor", fixture),
                      "--max-new-tokens", NEW_TOKENS, cwd=tmp_path)
    assert "format compressed-tensors:" in out and "generated ids:" in out
    assert len(json.loads(out.split("generated ids:")[1].strip())) == int(NEW_TOKENS)


@pytest.mark.parametrize("kind", ["autofp8", "deepseek-block", "finegrained", "fbgemm", "modelopt"])
def test_serve_pretrained_other_tools(kind, tmp_path):
    """The other tools' layouts, written from their documented contracts (tests/fixtures/make_foreign_fixtures.py)."""
    from fixtures.make_foreign_fixtures import write_fixture

    folder = tmp_path / kind
    write_fixture(kind, str(folder))
    out = run_example("serve_pretrained.py", folder, "--max-new-tokens", NEW_TOKENS, cwd=tmp_path)
    assert "FP8Linear layers" in out and "generated ids:" in out


def test_compare_schemes(tmp_path):
    need_smollm2()
    from pydoc_data.topics import topics

    eval_file = tmp_path / "my_eval.txt"
    eval_file.write_text("\n\n".join(topics[k] for k in ("if", "while", "for", "try")), encoding="utf-8")
    out = run_example("compare_schemes.py", "--eval", eval_file, "--samples", "2", "--windows", "1", "--seq-len", "64",
                      "--no-gptq", "-o", tmp_path / "report", cwd=tmp_path)
    assert "fp8-tensor" in out and "fp8-channel" in out
    report = json.loads((tmp_path / "report" / "comparison.json").read_text())
    assert {"fp8-tensor", "fp8-channel"} <= {r["scheme"] for r in report["rows"]}
    assert (tmp_path / "report" / "comparison.md").is_file()
