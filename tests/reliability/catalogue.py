"""The bad-input catalogue format shared by the ``test_bad_*`` files of this folder.

A :class:`Bad` case is one call that must fail with a typed error whose message names the
argument, the expected value and the actual value (docs/design.md section 8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest


@dataclass(frozen=True)
class Bad:
    """``call()`` must raise ``error`` with ``argument``, ``expected`` and ``actual`` in its message."""

    id: str
    call: Callable[[], object]
    error: type[BaseException]
    argument: str
    expected: str
    actual: str


def check_bad(case: Bad) -> None:
    """Run one catalogue case: the error type, then the three parts of the message."""
    with pytest.raises(case.error) as ei:
        case.call()
    msg = str(ei.value)
    for part in ("argument", "expected", "actual"):
        assert getattr(case, part) in msg, f"{part} {getattr(case, part)!r} missing from: {msg}"


def params(cases: list[Bad]):
    """``pytest.mark.parametrize`` arguments for a list of cases, ids from the cases."""
    return pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])
