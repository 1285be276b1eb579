"""No ``assert`` for validation in the package source (docs/design.md section 8): ``python -O`` strips
asserts, so a check written as one silently disappears. Scans the AST of every module."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The package source tree (fp8_linear, with fp8_linear/calibration and fp8_linear/kernels inside it).
SOURCE_DIRS = ("fp8_linear",)


def _sources():
    for d in SOURCE_DIRS:
        yield from sorted((ROOT / d).rglob("*.py"))


def test_source_dirs_exist():
    assert all((ROOT / d / "__init__.py").is_file() for d in SOURCE_DIRS)


@pytest.mark.parametrize("path", list(_sources()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_assert_statements(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert not found, f"use `raise` with a typed error instead of assert at: {', '.join(found)}"
