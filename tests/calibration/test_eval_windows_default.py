"""The CLI's default window count is the library's (the CLI keeps its own copy so that --help needs no torch)."""

from fp8_linear import cli
from fp8_linear.calibration import evaluate


def test_cli_default_windows_equal_library_default():
    assert cli.DEFAULT_EVAL_WINDOWS == evaluate.DEFAULT_EVAL_WINDOWS
    args = cli.build_parser().parse_args(["compare"])
    assert args.windows == evaluate.DEFAULT_EVAL_WINDOWS
    assert evaluate.DEFAULT_EVAL_WINDOWS % evaluate.DEFAULT_EVAL_BATCH_SIZE == 0  # full batches only
