"""Operand and scale builders of the benchmarks (benchmarks/common/operands.py), on the CPU."""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import operands as O


@pytest.mark.parametrize("kind", O.DATA_KINDS)
def test_operand_is_e4m3_of_the_asked_shape(kind):
    x = O.make_operand(64, 48, kind, device="cpu")
    assert x.dtype == torch.float8_e4m3fn and x.shape == (64, 48) and x.is_contiguous()


def test_operand_values_per_kind():
    g = torch.Generator().manual_seed(0)
    scaled = O.make_operand(256, 128, "scaled", device="cpu", generator=g).float()
    assert scaled.abs().max().item() == O.E4M3_MAX == 448.0  # the largest magnitude lands on 448
    assert torch.all(O.make_operand(8, 16, "ones", device="cpu").float() == 1.0)
    assert torch.all(O.make_operand(8, 16, "zeros", device="cpu").float() == 0.0)
    randn = O.make_operand(256, 128, "randn", device="cpu", generator=g).float()
    assert 0.8 < randn.std().item() < 1.2 and randn.abs().max().item() < 8.0


def test_unknown_kinds_are_refused():
    with pytest.raises(ValueError, match="unknown data kind"):
        O.make_operand(8, 16, "uniform", device="cpu")
    with pytest.raises(ValueError, match="unknown scale kind"):
        O.make_scale("channel", 8, 16, device="cpu")


@pytest.mark.parametrize("rows, k", [(1, 48), (7, 1040), (129, 16400), (4104, 128)])
def test_scale_layouts_follow_docs_section_2(rows, k):
    kb = -(-k // 128)
    want = {"tensor": (1,), "row": (rows, 1), "group": (rows, kb), "block": (-(-rows // 128), kb)}
    for kind, shape in want.items():
        s = O.make_scale(kind, rows, k, device="cpu")
        assert s.shape == shape and s.dtype == torch.float32
        if kind == "group":  # M-major, the layout the fused quantization writes and the kernel reads
            assert s.stride() == (1, -(-rows // 4) * 4)
        else:
            assert s.is_contiguous()
        assert bool(((s >= 0.5) & (s < 1.5)).all())


def test_column_major_keeps_values_and_transposes_strides():
    t = torch.arange(12.0).reshape(3, 4)
    cm = O.column_major(t)
    assert torch.equal(cm, t) and cm.stride() == (1, 3)


def test_rotation_copies_span_the_asked_bytes():
    mb = 2 ** 20
    assert O.rotation_copies(64 * mb, 256 * mb) == 4
    assert O.rotation_copies(470 * mb, 256 * mb) == 2  # a weight far beyond L2 still alternates two copies
    assert O.rotation_copies(1, 256 * mb, max_copies=512) == 512
    with pytest.raises(ValueError, match="bytes_per_copy"):
        O.rotation_copies(0, mb)
