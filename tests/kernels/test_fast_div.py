"""fp8_linear/kernels/include/fast_div.h (the tile walk's divisions by launch constants) against C++ integer
division: compiled here with the host C++ compiler (the header is plain C++ outside nvcc), run over
every divisor 1..5000, powers of two and their neighbours, random divisors up to 2^31 - 1, and
numerators at 0, around each multiple of the divisor and up to 2^31 - 1. Skips without a compiler."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

INCLUDE = pathlib.Path(__file__).resolve().parents[2] / "fp8_linear" / "kernels" / "include"

PROGRAM = r"""
#include <cstdio>
#include <cstdint>
#include <random>
#include "fast_div.h"
using fp8sm90::FastDiv;
using fp8sm90::fast_div;
using fp8sm90::make_fast_div;

static long checked = 0, wrong = 0;
static void check(int d, int n) {
  const FastDiv f = make_fast_div(d);
  ++checked;
  if (fast_div(n, f) != n / d || f.d != d) {
    if (wrong++ < 10) std::printf("WRONG d=%d n=%d got %d want %d\n", d, n, fast_div(n, f), n / d);
  }
}
static void check_divisor(int d, std::mt19937& rng) {
  const int64_t top = 2147483647;
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{1000}, top / d}) {
    for (int64_t j = -2; j <= 2; ++j) {
      const int64_t n = k * d + j;
      if (n >= 0 && n <= top) check(d, static_cast<int>(n));
    }
  }
  std::uniform_int_distribution<int> any(0, 2147483647);
  for (int i = 0; i < 64; ++i) check(d, any(rng));
  check(d, 2147483647);
}
int main() {
  std::mt19937 rng(7);
  for (int d = 1; d <= 5000; ++d) check_divisor(d, rng);
  for (int s = 1; s < 31; ++s)
    for (int j = -1; j <= 1; ++j) check_divisor((1 << s) + j, rng);
  check_divisor(2147483647, rng);
  std::uniform_int_distribution<int> div(1, 2147483647);
  for (int i = 0; i < 3000; ++i) check_divisor(div(rng), rng);
  std::printf("checked %ld wrong %ld\n", checked, wrong);
  return wrong == 0 ? 0 : 1;
}
"""


def test_fast_div_matches_integer_division(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler on this machine")
    src = tmp_path / "fast_div_check.cpp"
    exe = tmp_path / "fast_div_check"
    src.write_text(PROGRAM)
    build = subprocess.run([cxx, "-std=c++17", "-O2", f"-I{INCLUDE}", str(src), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "wrong 0" in run.stdout
