"""The division of the activation quantization kernels (``fp8_linear/kernels/csrc/act_quant.cu``, ``scaled``): the fp32
quotient ``v / scale`` is computed as RN32(RN64(v * RN64(1 / scale))) with one fp64 reciprocal a thread
instead of ``__fdiv_rn`` per element. Checked here on the CPU with numpy's IEEE fp32 division and fp64
arithmetic (the same roundings as the GPU's): the same fp32 quotient wherever it is at least 2^-126 (the
claim the kernel's comment proves), and the same e4m3 / e5m2 bytes after the clamp everywhere, over every
bf16 and every fp16 value against per-token scales of a spread of amaxes and static-style scales (1/3,
powers of two, subnormal, huge), and over random fp32 values and scales."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp8_linear.formats import MIN_SCALE, fmt_max

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
TINY = np.float32(2.0**-126)


def _all_16bit(kind: str) -> np.ndarray:
    """Every bf16 or fp16 bit pattern as fp32 (exact)."""
    bits = np.arange(65536, dtype=np.uint32)
    if kind == "bf16":
        return (bits << 16).view(np.float32)
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def _scales(rng: np.random.Generator, amaxes: np.ndarray, fmax: float) -> np.ndarray:
    """Per-token scales max(amax / fmax, MIN_SCALE) (fp32 division) of the given amaxes, and static ones."""
    with np.errstate(all="ignore"):
        token = np.maximum(amaxes / np.float32(fmax), np.float32(MIN_SCALE))
    static = np.array([1 / 3, 0.0123, 1.0, 2.0**-20, 2.0**20, 3.0, 7.0, 1.5e-38, 1e-45, 3.4e38, MIN_SCALE], dtype=np.float32)
    spread = rng.integers(0x00000001, 0x7F7FFFFF, 400, dtype=np.uint32).view(np.float32)
    s = np.concatenate([token, static, spread])
    return s[np.isfinite(s) & (s > 0)]


def _quotients(a: np.ndarray, s: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(fp32 IEEE a / s, the kernel's RN32(RN64(a * RN64(1 / s))))."""
    with np.errstate(all="ignore"):
        return a / s, (a.astype(np.float64) * (1.0 / np.float64(s))).astype(np.float32)


def _fp8_bytes(q: np.ndarray, fp8: torch.dtype) -> torch.Tensor:
    m = fmt_max(fp8)
    return torch.from_numpy(q).clamp(-m, m).to(fp8).view(torch.uint8)


def _check(a: np.ndarray, scales: np.ndarray, fp8s=(E4, E5)) -> int:
    checked = 0
    for s in scales:
        ref, ours = _quotients(a, s)
        same = (ref == ours) | (np.isnan(ref) & np.isnan(ours))
        normal = ~np.isnan(ref) & (np.abs(ref) >= TINY)
        assert same[normal].all(), f"scale {s!r}: fp32 quotient differs at a = {a[normal & ~same][:4]}"
        if not same.all():  # only fp32 subnormal quotients may differ: their fp8 bytes may not
            for fp8 in fp8s:
                assert torch.equal(_fp8_bytes(ref, fp8), _fp8_bytes(ours, fp8)), f"scale {s!r} {fp8}"
        checked += a.size
    return checked


@pytest.mark.parametrize("kind", ["bf16", "fp16"])
def test_every_16bit_value_against_many_scales(kind):
    rng = np.random.default_rng(1 if kind == "bf16" else 2)
    a = _all_16bit(kind)
    finite = a[np.isfinite(a) & (a > 0)]
    amaxes = np.concatenate([finite[:: max(1, finite.size // 600)], finite[-8:], finite[:8]])
    scales = np.concatenate([_scales(rng, amaxes, fmt_max(E4)), _scales(rng, amaxes[::7], fmt_max(E5))])
    assert _check(a, scales) > 60_000_000


def test_random_fp32_values_and_scales():
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(12):
        a = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
        s = rng.integers(0x00000001, 0x7F7FFFFF, 3, dtype=np.uint32).view(np.float32)
        checked += _check(a, np.concatenate([s, np.array([1 / 3, 0.0123], dtype=np.float32)]), fp8s=(E4,))
    assert checked == 60_000_000


def test_specials_follow_ieee():
    """Zeros keep their sign, infinities and NaN pass as IEEE division gives them, at ordinary and extreme scales;
    an exact tie in the fp32 subnormals (one of the two roundings may differ there) gives the same fp8 bytes."""
    a = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38, 448.0, 448.5], dtype=np.float32)
    for s in np.array([1 / 3, 1e-12, 1e-45, 3.4e38, 1.0], dtype=np.float32):
        ref, ours = _quotients(a, s)
        assert np.array_equal(np.signbit(ref), np.signbit(ours)) and np.array_equal(np.isnan(ref), np.isnan(ours))
        assert torch.equal(_fp8_bytes(ref, E4), _fp8_bytes(ours, E4)), f"scale {s!r}"
    tie_a, tie_s = np.float32(3 * 2.0**-140), np.float32(3072.0)  # a / s = 2^-150: the tie between 0 and 2^-149
    ref, ours = _quotients(np.array([tie_a, -tie_a]), tie_s)
    assert torch.equal(_fp8_bytes(ref, E4), _fp8_bytes(ours, E4))
