"""What the CLI prints: --version, help texts that state the real defaults, -q (results and errors only),
-v (thread count), and a closed pipe (``| head``) without a traceback."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

from fp8_linear.cli import EXIT_OK, build_parser, main

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
TIMEOUT_S = 600


def cli(*argv: str) -> subprocess.CompletedProcess:
    """Run ``python -m fp8_linear.cli`` in a fresh process (real stdout/stderr, real library output)."""
    return subprocess.run([sys.executable, "-m", "fp8_linear.cli", *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=ENV)


def subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    act = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(act.choices)


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith(f"fp8-linear {metadata.version('fp8-linear')} ") and "torch " in out


def test_every_command_has_quiet_and_verbose():
    for name, p in subparsers(build_parser()).items():
        opts = {o for a in p._actions for o in a.option_strings}
        assert {"-q", "--quiet", "-v", "--verbose"} <= opts, name


def test_help_states_the_real_defaults():
    """Every "(default N)" in a help text is the value the parser really gives that option."""
    checked = 0
    for name, p in subparsers(build_parser()).items():
        for a in p._actions:
            if not a.help or a.default is None or isinstance(a.default, (bool, list)) or a.default == argparse.SUPPRESS:
                continue
            text = a.help % {"default": a.default} if "%(default)" in a.help else a.help
            m = re.search(r"\(default (\S+?)(?=[\s:;,)])", text)
            assert m, f"{name} {a.option_strings}: help does not state its default {a.default!r}"
            assert m.group(1) == str(a.default), f"{name} {a.option_strings}: help says {m.group(1)}, default is {a.default}"
            checked += 1
    assert checked >= 15
    compare = subparsers(build_parser())["compare"]
    samples = next(a for a in compare._actions if a.dest == "samples")
    assert samples.default == 16 and "16" in compare.format_help()


def test_inspect_into_a_closed_pipe(tiny_fp8_checkpoint):
    """``fp8-linear inspect --tensors | head -1``: one line out, no traceback, no error line."""
    r = subprocess.run(f"{sys.executable} -m fp8_linear.cli inspect {tiny_fp8_checkpoint} --tensors | head -1",
                       shell=True, capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV)
    assert r.stdout.startswith("checkpoint ") and len(r.stdout.splitlines()) == 1
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_quiet_prints_only_results(tiny_fp8_checkpoint, tiny_llama_dir, text_file):
    r = cli("eval", str(tiny_fp8_checkpoint), "--reference", str(tiny_llama_dir), "--data", str(text_file),
            "--windows", "1", "--seq-len", "32", "-q")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr  # no bars, no "loaded ...", no transformers messages, no warnings
    assert [ln.split()[0] for ln in r.stdout.splitlines()] == ["reference", "model"]


def test_default_output_shows_progress_but_no_thread_line(tiny_fp8_checkpoint, text_file):
    r = cli("eval", str(tiny_fp8_checkpoint), "--data", str(text_file), "--windows", "1", "--seq-len", "32")
    assert r.returncode == 0, r.stderr
    assert "loaded " in r.stderr and "evaluating" in r.stderr
    assert "torch threads" not in r.stderr


def test_verbose_prints_the_thread_count(tiny_fp8_checkpoint, text_file):
    r = cli("eval", str(tiny_fp8_checkpoint), "--data", str(text_file), "--windows", "1", "--seq-len", "32", "-v", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"torch threads: 1 \(cpus \d+", r.stderr)


def test_error_in_a_fresh_process_is_one_line(tmp_path):
    r = cli("eval", "--data", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"fp8-linear eval: error: --data: {str(tmp_path / 'missing.jsonl')!r} does not exist"]


def test_usage_error_keeps_exit_code_2():
    r = cli("eval", "--seq-len", "many")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("fp8-linear eval: error: argument --seq-len")


def test_gptq_pass_has_a_progress_bar_labelled_with_the_preset(tiny_llama_dir, text_file, tmp_path, capsys):
    assert main(["quantize", "--model", str(tiny_llama_dir), "--scheme", "fp8-dynamic", "--calib", str(text_file),
                 "--samples", "8", "--seq-len", "32", "-o", str(tmp_path / "o")]) == EXIT_OK
    err = capsys.readouterr().err
    assert "calibrating" in err and "GPTQ fp8-dynamic" in err


def test_quiet_quantize_has_no_bars(tiny_llama_dir, text_file, tmp_path, capsys):
    assert main(["quantize", "--model", str(tiny_llama_dir), "--calib", str(text_file),
                 "--samples", "8", "--seq-len", "32", "-o", str(tmp_path / "o"), "-q"]) == EXIT_OK
    cap = capsys.readouterr()
    assert "GPTQ" not in cap.err and "calibrating" not in cap.err
    assert cap.out.startswith("quantized 14 Linear layers with fp8-channel")
