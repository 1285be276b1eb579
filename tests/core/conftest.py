"""Core tests: fresh random inputs each run, with the seed shown on failure."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Seed torch from the OS for every test; the seed is in the failure report (``FP8_TEST_SEED`` replays it)."""
    seed = int(os.environ.get("FP8_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        seeds = [v for k, v in item.user_properties if k == "seed"]
        if seeds:
            rep.sections.append(("seed", f"replay with FP8_TEST_SEED={seeds[0]}"))


@pytest.fixture(autouse=True)
def fresh_settings():
    """Every test starts and ends with the settings read from the environment it sees
    (``fp8_linear.settings`` reads the variables once; tests that change them call :func:`fp8_env`)."""
    from fp8_linear import settings

    settings.reload()
    yield
    settings.reload()


@pytest.fixture
def fp8_env(monkeypatch):
    """``fp8_env(FP8_LINEAR_BACKEND="emulated")``: set (a value) or unset (``None``) variables for the
    test and reload ``fp8_linear.settings``; undone after the test."""
    from fp8_linear import settings

    def set_env(**values):
        for name, value in values.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        return settings.reload()

    return set_env
