"""No name at the repo root hides an installed package (docs/design.md section 1).

pytest (``pythonpath = ["."]``), ``python -m`` and the working directory put the repo root first on
``sys.path``. A root folder with an ``__init__.py`` (or a root ``.py`` file) whose name is also a
top-level module of an installed distribution wins over the installed one. That is how a root folder
called ``kernels`` once hid Hugging Face's ``kernels`` package: transformers 5.25 runs ``from kernels
import CUDAProperties`` at import time, and every test that imported transformers failed to collect.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Top-level import names that installed distributions are known to claim (Hugging Face's ``kernels``,
#: which transformers imports when present), or that our own subpackages use: never at the root.
RESERVED = ("kernels", "calibration")
#: Our own distribution's import name, the one root package that must be there.
OWN = "fp8_linear"


def _root_import_names() -> set[str]:
    """Names ``import <name>`` resolves to a file under the root: regular packages and modules."""
    names = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    names |= {p.stem for p in ROOT.glob("*.py")}
    return names


def test_reserved_names_not_at_root():
    assert [n for n in RESERVED if (ROOT / n).exists()] == []


def test_no_root_package_shadows_an_installed_distribution():
    installed = importlib.metadata.packages_distributions()
    clashes = {n: installed[n] for n in _root_import_names() - {OWN} if n in installed}
    assert clashes == {}, f"repo-root packages hide installed distributions: {clashes}"


def test_transformers_imports_with_root_first_on_path():
    """transformers (and, where installed, Hugging Face's ``kernels``) import from site-packages when the
    repo root is the working directory and the first ``sys.path`` entry, as under pytest."""
    code = (
        "import sys, importlib.util; sys.path.insert(0, sys.argv[1]);"
        "from transformers import LlamaConfig;"
        "spec = importlib.util.find_spec('kernels');"
        "print(spec.origin if spec is not None and spec.origin else '')"
    )
    r = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    origin = r.stdout.strip()
    assert not origin or pathlib.Path(origin).resolve().parent.parent != ROOT, origin  # not <root>/kernels/
