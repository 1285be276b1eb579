"""MoE tests: fresh random inputs each run, the seed shown on failure (the fixtures of tests/core)."""

from core.conftest import fresh_seed, pytest_runtest_makereport  # noqa: F401
