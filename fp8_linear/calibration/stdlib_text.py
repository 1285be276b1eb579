"""A second real English text that ships with every Python: docstrings of standard-library modules.

Technical prose written by other authors than the language reference in ``pydoc_data.topics`` (the
embedded calibration / eval corpus), so a calibration tuned on the one is tested on text it never saw.

Extraction is pinned so that every machine with the same Python minor version gets the same text
(:func:`stdlib_text_digest` prints its SHA-256): the module list :data:`STDLIB_DOC_MODULES` is fixed
and sorted; each module's *source file* is parsed with :mod:`ast` (nothing is imported, so platform,
installed extras and import side effects play no part); the docstrings of the module and of every
class and function in it are taken in source order with ``ast.get_docstring(clean=True)``; paragraphs
holding a doctest (a line starting with ``>>>``) are dropped, so the text is prose; docstrings of fewer
than :data:`MIN_WORDS` words are dropped; the rest are joined with blank lines. A module whose
source is absent in this Python (e.g. ``_pydatetime`` before 3.12) is skipped by name.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util

#: Pure-Python standard-library modules with substantial prose docstrings (sorted; fixed).
STDLIB_DOC_MODULES = (
    "_pydecimal", "_pyio", "argparse", "ast", "asyncio.events", "bisect", "calendar", "collections",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "difflib", "email.message", "enum",
    "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac",
    "http.client", "http.cookiejar", "imaplib", "inspect", "ipaddress", "json", "locale", "logging",
    "mailbox", "netrc", "numbers", "optparse", "pathlib", "pickle", "pprint", "queue", "random",
    "sched", "secrets", "selectors", "shlex", "shutil", "smtplib", "socketserver", "statistics",
    "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize",
    "traceback", "typing", "unittest.case", "urllib.parse", "urllib.request", "uuid", "warnings",
    "weakref", "zipfile",
)
#: Docstrings shorter than this many words (one-liners like "Return the name.") are dropped.
MIN_WORDS = 20


def _module_source(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return None
    with open(origin, encoding="utf-8") as f:
        return f.read()


def _prose(doc: str) -> str:
    """``doc`` without the paragraphs (blank-line separated) that hold a doctest line ``>>> ...``."""
    paras = doc.split("\n\n")
    return "\n\n".join(p for p in paras if not any(ln.lstrip().startswith(">>>") for ln in p.splitlines()))


def module_docstrings(source: str, min_words: int = MIN_WORDS) -> list[str]:
    """The docstrings of a module's source text: the module's, then every class' and function's in
    ``ast.walk`` order, cleaned (``ast.get_docstring(clean=True)``) and without doctest paragraphs,
    those of ``>= min_words`` words."""
    tree = ast.parse(source)
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    docs = (_prose(d) for d in (ast.get_docstring(n, clean=True) for n in nodes) if d)
    return [d for d in docs if len(d.split()) >= min_words]


@functools.lru_cache(maxsize=1)
def stdlib_text() -> str:
    """The docstrings of :data:`STDLIB_DOC_MODULES` (in that order), joined by blank lines.

    About 482,000 characters (1,130 docstrings) on CPython 3.11.7. Raises ``RuntimeError`` if no module
    source is found (a Python installed without its ``.py`` sources).
    """
    docs: list[str] = []
    for name in STDLIB_DOC_MODULES:
        src = _module_source(name)
        if src is not None:
            docs.extend(module_docstrings(src))
    if not docs:
        raise RuntimeError("stdlib_text: no standard-library source file found (Python installed without .py sources?)")
    return "\n\n".join(docs)


def stdlib_text_digest() -> str:
    """SHA-256 (hex) of :func:`stdlib_text` encoded as UTF-8: equal digests mean equal eval text."""
    return hashlib.sha256(stdlib_text().encode("utf-8")).hexdigest()
