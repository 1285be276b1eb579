"""benchmarks/tools/sass_diff.py on listings written as ``cuobjdump -sass`` prints them."""

from __future__ import annotations

import shutil

import pytest

from benchmarks.tools import sass_diff as SD

LISTING = """
	code for sm_90a
	.target	sm_90a

		Function : {name}
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*{a0}*/                   LDC R1, c[0x0][0x28] ;           /* 0x00000a00ff017b82 */
                                                                    /* 0x000fe20000000800 */
        /*{a1}*/                   {op} R5, SR_TID.X ;               /* 0x0000000000057919 */
                                                                    /* 0x000e2e0000002100 */
        /*{a2}*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24 ;  /* 0x0000000405027825 */
                                                                    /* 0x001fca00078e0002 */
        /*{a3}*/                   STL [R1], R5 ;     /* 0x0000000402007981 */
                                                                    /* 0x000ea4000c1e1900 */
"""


def listing(name="k", op="S2R", base=0):
    return LISTING.format(name=name, op=op, **{f"a{i}": f"{base + 16 * i:04x}" for i in range(4)})


def test_parse_drops_addresses_and_encodings():
    funcs = SD.parse_sass(listing())
    assert funcs == {"k": ["LDC R1, c[0x0][0x28] ;", "S2R R5, SR_TID.X ;",
                           "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24 ;", "STL [R1], R5 ;"]}
    assert "wgmma 1, spills 1" in SD.summary(funcs)


def test_same_code_at_another_address_is_identical():
    report, same = SD.compare(SD.parse_sass(listing(base=0)), SD.parse_sass(listing(base=0x400)))
    assert same and "1 of 1 kernels identical" in report


def test_changed_and_missing_kernels_are_reported():
    a = SD.parse_sass(listing("k") + listing("gone"))
    b = SD.parse_sass(listing("k", op="S2UR") + listing("new"))
    report, same = SD.compare(a, b, show=5)
    assert not same
    assert "DIFFERS (4 vs 4 instructions, 2 changed lines): k" in report
    assert "only in a: gone" in report and "only in b: new" in report
    assert "    -S2R R5, SR_TID.X ;" in report and "    +S2UR R5, SR_TID.X ;" in report


def test_main_refuses_a_wrong_file_count(capsys):
    assert SD.main(["--summary", "a.so", "b.so"]) == 2
    assert "expected one file" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump (CUDA toolkit) not on PATH")
def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert SD.main([str(tmp_path / "none.so"), str(tmp_path / "none.so")]) == 2
    assert "cuobjdump -sass" in capsys.readouterr().err
