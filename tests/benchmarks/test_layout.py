"""The benchmarks' module layout: an entry point (a module directly in ``benchmarks/`` with a
``__main__`` block, run as ``python -m benchmarks.<name>``) imports no other entry point; what two of
them share lives in the libraries ``benchmarks/common/`` and ``benchmarks/tools/``, which import no
entry point either. A module directly in ``benchmarks/`` without a ``__main__`` block (``gemm_run``)
is a part of the one entry point that imports it.

Imports are read with ``ast`` from the source (nothing is imported), in every spelling: ``import
benchmarks.x``, ``from benchmarks.x import ...``, ``from benchmarks import x``, relative imports, and
the bare ``from x import ...`` of a script that puts ``benchmarks/`` on ``sys.path``."""

from __future__ import annotations

import ast
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
LIBRARIES = ("common", "tools")
#: Imports of an entry point by another module that remain, each with what it imports. The list only
#: shrinks: when one is moved into benchmarks/common/, the test fails until its entry is deleted here.
KNOWN: dict[tuple[str, str], str] = {}


def top_level() -> set[str]:
    """Names of the modules directly in benchmarks/ (entry points and their parts)."""
    return {p.stem for p in BENCH.glob("*.py") if p.stem != "__init__"}


def has_main_block(path: pathlib.Path) -> bool:
    """Whether the module has an ``if __name__ == "__main__":`` block at its top level."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            sides = [node.test.left, *node.test.comparators]
            if any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and \
                    any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides):
                return True
    return False


def entry_points() -> set[str]:
    """The modules directly in benchmarks/ that run as ``python -m benchmarks.<name>``."""
    return {n for n in top_level() if has_main_block(BENCH / f"{n}.py")}


def imported_top_level(path: pathlib.Path, package: tuple[str, ...], names: set[str]) -> set[str]:
    """The modules of ``names`` (directly in benchmarks/) that the file at ``path`` imports; ``package``
    is the file's package (``("benchmarks",)`` or ``("benchmarks", "common")``) for relative imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "benchmarks" and len(parts) > 1 and parts[1] in names:
                    found.add(parts[1])
                elif len(parts) == 1 and parts[0] in names:  # script style: benchmarks/ on sys.path
                    found.add(parts[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                parts = base + (node.module.split(".") if node.module else [])
            else:
                parts = node.module.split(".") if node.module else []
            if parts[:1] == ["benchmarks"]:
                if len(parts) > 1:
                    if parts[1] in names:
                        found.add(parts[1])
                else:  # from benchmarks import x
                    found.update(a.name for a in node.names if a.name in names)
            elif len(parts) == 1 and parts[0] in names and not node.level:  # script style
                found.add(parts[0])
    return found


def edges() -> set[tuple[str, str]]:
    """Every (importer, imported) pair where the imported module is directly in benchmarks/; the
    importer is named by its stem, or ``common/x`` / ``tools/x`` for a library."""
    names = top_level()
    out = set()
    for path in BENCH.glob("*.py"):
        out |= {(path.stem, m) for m in imported_top_level(path, ("benchmarks",), names) if m != path.stem}
    for lib in LIBRARIES:
        for path in (BENCH / lib).glob("*.py"):
            out |= {(f"{lib}/{path.stem}", m) for m in imported_top_level(path, ("benchmarks", lib), names)}
    return out


def test_entry_points_are_found():
    entries = entry_points()
    assert {"e2e", "step_profile", "host_overhead", "gemm_bench"} <= entries
    assert "gemm_run" not in entries and "__init__" not in entries


def test_no_module_imports_an_entry_point():
    entries = entry_points()
    new = sorted((a, b) for a, b in edges() - set(KNOWN) if b in entries)
    assert not new, f"modules importing an entry point; move what they share into benchmarks/common/: {new}"


def test_known_debt_is_still_there():
    """An entry of KNOWN that no longer exists must be deleted from it (the list only shrinks)."""
    gone = sorted(set(KNOWN) - edges())
    assert not gone, f"delete these from KNOWN, they were fixed: {gone}"


def test_a_part_belongs_to_one_entry_point():
    """A module directly in benchmarks/ without a ``__main__`` block is imported by one entry point at
    most and by no library (shared code belongs in benchmarks/common/)."""
    parts = top_level() - entry_points()
    for part in parts:
        importers = {a for a, b in edges() if b == part}
        assert len(importers) <= 1 and not any("/" in a for a in importers), (part, importers)


def test_main_block_reader(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def main():\n    return 0\n\nif __name__ == '__main__':\n    raise SystemExit(main())\n")
    assert has_main_block(f)
    f.write_text("def main():\n    if __name__ == 'x':\n        pass\n")
    assert not has_main_block(f)


@pytest.mark.parametrize("source,want", [
    ("import benchmarks.e2e", {"e2e"}),
    ("from benchmarks.e2e import build_model", {"e2e"}),
    ("from benchmarks import e2e, common", {"e2e"}),
    ("from benchmarks.common.random_model import build_model", set()),
    ("from . import e2e", {"e2e"}),
    ("from .e2e import main", {"e2e"}),
    ("from .common import budget", set()),
    ("from e2e import main", {"e2e"}),
    ("import e2e", {"e2e"}),
    ("def f():\n    try:\n        from benchmarks.e2e import x\n    except ImportError:\n        pass", {"e2e"}),
    ("import fp8_linear.e2e", set()),
])
def test_import_reader(tmp_path, source, want):
    """The reader finds every spelling of an import of a top-level module, and nothing else."""
    f = tmp_path / "m.py"
    f.write_text(source + "\n")
    assert imported_top_level(f, ("benchmarks",), {"e2e", "step_profile"}) == want


def test_relative_import_from_a_library(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from ..e2e import main\nfrom .budget import Budget\n")
    assert imported_top_level(f, ("benchmarks", "common"), {"e2e", "budget"}) == {"e2e"}
