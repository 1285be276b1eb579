"""The folders that ``make demo`` and the example scripts write by default are in ``.gitignore``: a user
who runs them in a clone does not see their outputs as changes to commit."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from fp8_linear.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
#: ``add_argument(..., "--output", default="name"`` in a script: the folder it writes when run as documented.
_DEFAULT_OUTPUT = re.compile(r"add_argument\([^)]*\"--output\",\s*default=\"([^\"]+)\"")


def _ignored(name: str, patterns: list[str]) -> bool:
    """Whether the top-level folder ``name`` matches one of ``.gitignore``'s patterns (the subset it uses:
    plain names and globs, anchored with a leading ``/``, folders with a trailing ``/``)."""
    return any(fnmatch.fnmatch(name, p.strip("/")) for p in patterns)


def _gitignore() -> list[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith(("#", "!"))]


def _default_outputs() -> dict[str, str]:
    act = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    compare = next(a for a in act.choices["compare"]._actions if a.dest == "output")
    found = {"make demo (fp8-linear compare)": compare.default}
    for script in sorted((ROOT / "examples").glob("*.py")):
        for m in _DEFAULT_OUTPUT.finditer(script.read_text()):
            found[f"examples/{script.name}"] = m.group(1)
    return found


def test_default_output_folders_are_ignored():
    outputs = _default_outputs()
    assert "make demo (fp8-linear compare)" in outputs and len(outputs) >= 2, outputs
    patterns = _gitignore()
    missing = {who: name for who, name in outputs.items() if not _ignored(Path(name).parts[0], patterns)}
    assert not missing, f"default output folders not in .gitignore: {missing}"


def test_the_check_sees_an_unignored_name():
    assert _ignored("fp8-compare", ["/fp8-compare/"]) and _ignored("x.pyc", ["*.pyc"])
    assert not _ignored("fp8-compare-report", ["/fp8-compare/"])
