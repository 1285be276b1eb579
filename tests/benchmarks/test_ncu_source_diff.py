"""CPU tests of benchmarks/tools/ncu_source_diff.py on small exports written like ncu's ``--page source --csv``."""

from __future__ import annotations

import csv
import pathlib

import pytest

from benchmarks.tools import ncu_source_diff as nsd

HEADER = ["Address", "Source", nsd.SAMPLES, nsd.EXECUTED, "stall_short_sb", "stall_wait",
          "stall_short_sb (Not Issued)"]


def write_export(path: pathlib.Path, base: int, rows: list[tuple[str, int, int, int, int]]) -> str:
    """An export as ncu writes it: log lines, the kernel-name line, the header, one row per SASS line
    at addresses from ``base`` (each process loads the code elsewhere)."""
    with open(path, "w", newline="") as f:
        f.write("==PROF== Connected to process 1\n")
        w = csv.writer(f)
        w.writerow(["Kernel Name", "void k()"])
        w.writerow(HEADER)
        for i, (sass, samples, executed, short_sb, wait) in enumerate(rows):
            addr = hex(base + 16 * i)
            w.writerow([addr, sass.replace("TARGET", hex(base + 0x40)), f"{samples:,}", f"{executed:,}",
                        short_sb, wait, 0])
    return str(path)


def test_compare_reports_totals_reasons_and_lines(tmp_path):
    sass = ["LDS.128 R4, [R2]", "FFMA R5, R4, R5, RZ", "@P0 BRA TARGET"]
    # (sass, samples, executed, short_sb, wait): b's FFMA waits 40 samples more on short_sb
    a = write_export(tmp_path / "a.csv", 0x7F0000000000,
                     [(sass[0], 1, 10, 0, 1), (sass[1], 2, 10, 1, 1), (sass[2], 1200, 10, 0, 1200)])
    b = write_export(tmp_path / "b.csv", 0x7E0000000000,
                     [(sass[0], 1, 10, 0, 1), (sass[1], 42, 10, 41, 1), (sass[2], 1200, 10, 0, 1200)])
    report = nsd.compare(nsd.read_listing(a), nsd.read_listing(b), top=1)
    assert "samples: a 1203, b 1243, b - a +40 (+3.3%)" in report
    reasons = {line.split()[0]: line.split()[1:] for line in report.splitlines() if line.startswith("stall_")}
    assert reasons == {"stall_short_sb": ["1", "41", "+40"], "stall_wait": ["1202", "1202", "+0"]}
    last = report.splitlines()[-1]  # the one listed line: the FFMA, index 1, short_sb in b
    assert last.split()[:4] == ["1", "2", "42", "+40"] and "short_sb" in last and "FFMA" in last


def test_compare_refuses_different_sass(tmp_path):
    a = write_export(tmp_path / "a.csv", 0x1000000, [("FADD R1, R1, R2", 1, 1, 0, 0)])
    b = write_export(tmp_path / "b.csv", 0x1000000, [("FMUL R1, R1, R2", 1, 1, 0, 0)])
    with pytest.raises(ValueError, match="different SASS at line 0"):
        nsd.compare(nsd.read_listing(a), nsd.read_listing(b))


def test_main_reports_a_file_that_is_not_an_export(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("==PROF== nothing profiled\n")
    assert nsd.main([str(bad), str(bad)]) == 1
    assert "no 'Address','Source' header row" in capsys.readouterr().err
