"""The second held-out text (standard-library docstrings, ``fp8_linear/calibration/stdlib_text.py``): extraction rules
on a hand-written source, and the real text's properties (prose only, pinned and reproducible, disjoint
from the embedded ``pydoc_data.topics`` corpus that calibration and the other eval splits come from)."""

from __future__ import annotations

import hashlib
import re
import sys
import textwrap

import pytest

from fp8_linear.calibration import stdlib_text as st
from fp8_linear.calibration.data import corpus_text

#: The digest docs/calibration.md names for CPython 3.11.7 (another Python has other docstrings).
DIGEST_3_11_7 = "fbe930ece6d5e1c767b7a7fc7c533177f6293af019a3cd41bded89f2fafe265e"
#: Sentences at least this long are specific enough that a shared one would mean shared text.
SENTENCE_WORDS = 12

LONG = " ".join(["word"] * 25)
SOURCE = textwrap.dedent(f'''
    """Module docstring. {LONG}"""

    def short():
        """Return the name."""

    class Box:
        """Class docstring. {LONG}

        >>> Box().open()
        True

        Closing paragraph of the class. {LONG}"""

        def method(self):
            """Method docstring. {LONG}"""

    async def fetch():
        """Coroutine docstring. {LONG}"""
''')


def test_module_docstrings_follows_its_rules():
    docs = st.module_docstrings(SOURCE)
    # the module first, then ast.walk order (breadth first: top-level defs before the method);
    # the one-liner dropped; the doctest paragraph removed, the prose around it kept
    heads = [d.split(".")[0] for d in docs]
    assert heads == ["Module docstring", "Class docstring", "Coroutine docstring", "Method docstring"]
    assert docs[1] == f"Class docstring. {LONG}\n\nClosing paragraph of the class. {LONG}"
    assert all(">>>" not in d for d in docs)
    assert st.module_docstrings(SOURCE, min_words=1)[1:2] == ["Return the name."]


def test_stdlib_text_is_prose_and_reproducible():
    text = st.stdlib_text()
    assert len(text) > 100_000
    assert not [ln for ln in text.splitlines() if ln.lstrip().startswith(">>>")]
    st.stdlib_text.cache_clear()  # a second extraction from the source files, not the cached string
    again = st.stdlib_text()
    assert again == text
    digest = hashlib.sha256(again.encode("utf-8")).hexdigest()
    assert st.stdlib_text_digest() == digest
    if sys.version_info[:3] == (3, 11, 7) and sys.implementation.name == "cpython":
        assert digest == DIGEST_3_11_7
    assert all(st._module_source(m) is not None for m in st.STDLIB_DOC_MODULES), "a listed module lost its source"


def test_stdlib_text_shares_no_sentence_with_the_embedded_corpus():
    corpus = corpus_text("all")
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", st.stdlib_text()) if len(s.split()) >= SENTENCE_WORDS]
    assert len(sentences) > 1000
    shared = [s for s in sentences if s in corpus]
    assert not shared, shared[:3]


def test_no_source_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(st, "STDLIB_DOC_MODULES", ("no_such_module_for_fp8_linear",))
    st.stdlib_text.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="no standard-library source"):
            st.stdlib_text()
    finally:
        st.stdlib_text.cache_clear()
