"""The CLI's torch thread choice: an explicit request wins; otherwise the CPUs that other processes
leave free, at least 1 and at most torch's default."""

from __future__ import annotations

import os

import torch

import fp8_linear.cli.threads as cli


def test_requested_threads_win():
    assert cli.pick_threads(3) == 3


def test_idle_machine_uses_every_core(monkeypatch):
    monkeypatch.setattr(cli, "busy_elsewhere", lambda: 0.0)
    assert cli.pick_threads(0) == min(torch.get_num_threads(), os.cpu_count() or 1)


def test_saturated_machine_uses_one_thread(monkeypatch):
    monkeypatch.setattr(cli, "busy_elsewhere", lambda: 100.0)
    assert cli.pick_threads(0) == 1


def test_busy_elsewhere_is_bounded_by_the_load_average():
    before = os.getloadavg()[0]
    b = cli.busy_elsewhere()
    after = os.getloadavg()[0]
    assert 0 <= b <= max(before, after)
