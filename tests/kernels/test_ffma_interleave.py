"""kernels/jit/ffma_interleave.py: the FFMA interleaving pass over the block instances' promotion.

The logic tests run everywhere. The binary tests compile ``csrc/sm90_gemm_e4m3_e4m3.cu`` with nvcc
(about 2-4 min on 2 cores; ``FP8_LINEAR_FFMA_TEST_OBJECT`` may name an object built from it with the
JIT's flags instead), patch copies of the object and compare both ``cuobjdump -sass`` listings and the
bytes: they skip cleanly without nvcc or cuobjdump (as on CI).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import struct
import subprocess

import pytest

from fp8_linear.kernels import jit
from fp8_linear.kernels.jit import ffma_interleave as fi

KERNELS = pathlib.Path(jit.__file__).resolve().parents[1]
TU = KERNELS / "csrc" / "sm90_gemm_e4m3_e4m3.cu"
#: config 7's block instance (128 x 128, not swapped, two accumulators, not split, BLK, 128 rows)
CFG7_BLOCK = "_ZN7fp8sm9020fp8_gemm_sm90_kernelILi128ELb0ELi1ELi0ELi0ELb1ELb0ELb1ELi128EEEv14CUtensorMap_stS1_S1_iiiNS_9EpiParamsEi"
CFG7_PLAIN = CFG7_BLOCK.replace("ELb1ELb0ELb1ELi128E", "ELb1ELb0ELb0ELi128E")

needs_toolchain = pytest.mark.skipif(jit.find_nvcc() is None or fi.find_cuobjdump() is None,
                                     reason="nvcc and cuobjdump (CUDA toolkit) needed to build and read SASS")


# ------------------------------------------------------------------------------------- logic only
def test_block_flag_reads_the_blk_template_argument():
    assert fi.block_flag(CFG7_BLOCK) is True
    assert fi.block_flag(CFG7_PLAIN) is False
    grouped = "_ZN7fp8sm9023fp8_grouped_sm90_kernelILi128ELi1ELi0ELi0ELb1ELb1EEEv14CUtensorMap_stS1_S1_NS_13GroupedParamsE"
    assert fi.block_flag(grouped) is True
    assert fi.block_flag(grouped.replace("ELb1ELb1EE", "ELb1ELb0EE")) is False
    assert fi.block_flag("_ZN7fp8sm9015act_quant_kernelEv") is None


def test_requested_mode(monkeypatch):
    for raw, mode in (("", None), ("0", None), ("1", "deepgemm"), ("deepgemm", "deepgemm"), ("all", "all")):
        monkeypatch.setenv(fi.ENV, raw)
        assert fi.requested_mode() == mode
    monkeypatch.setenv(fi.ENV, "2")
    with pytest.raises(ValueError, match=fi.ENV):
        fi.requested_mode()


def _ffma(addr, dst, a, b, reuse_bit=None, yield_set=True):
    high = (1 << fi.YIELD_BIT if yield_set else 0) | (1 << reuse_bit if reuse_bit else 0)
    ra = a + (".reuse" if reuse_bit == fi.REUSE_A_BIT else "")
    rb = b + (".reuse" if reuse_bit == fi.REUSE_B_BIT else "")
    return fi.Instruction(addr, f"FFMA {dst}, {ra}, {rb}, {dst}", 0, high)


def test_deepgemm_rule_alternates_within_one_factor_and_all_mode_takes_every_flagged_one():
    # 16 in-place FFMAs on one factor R9 in operand b, all reuse-flagged (a tile's last promotion)
    code = [_ffma(16 * i, f"R{100 + i}", f"R{20 + i}", "R9", fi.REUSE_B_BIT) for i in range(16)]
    code.append(fi.Instruction(256, "EXIT", 0, 0))
    runs = fi.promotion_runs(code)
    assert runs == [list(range(16))]
    # first 9/16 of 16 = 9 -> 8 considered; patched 0, 2, 4, 6 (kept 1, 3, 5, 7)
    assert fi.select(code, runs[0], "deepgemm") == {0: 59, 2: 59, 4: 59, 6: 59}
    assert fi.select(code, runs[0], "all") == {i: 59 for i in range(16)}
    # the factor in operand a (ptxas commutes it): the a-slot flag is the one cleared
    code_a = [_ffma(16 * i, f"R{100 + i}", "R9", f"R{20 + i}", fi.REUSE_A_BIT) for i in range(8)]
    # 8 * 9 // 16 = 4 considered: patched 0 and 2
    assert fi.select(code_a, fi.promotion_runs(code_a)[0], "deepgemm") == {0: 58, 2: 58}


def test_runs_need_min_run_in_place_ffmas():
    short = [_ffma(16 * i, f"R{100 + i}", f"R{20 + i}", "R9", fi.REUSE_B_BIT) for i in range(fi.MIN_RUN - 1)]
    assert fi.promotion_runs(short) == []
    not_in_place = [fi.Instruction(16 * i, f"FFMA R{100 + i}, R{20 + i}, R9.reuse, R{200 + i}", 0, 0) for i in range(16)]
    assert fi.promotion_runs(not_in_place) == []


def test_patched_high_clears_exactly_two_bits_and_refuses_unexpected_words():
    high = 0x080FE200000000A1  # from config 7's block promotion: FFMA R161, R116, R217.reuse, R161
    new = fi.patched_high(high, fi.REUSE_B_BIT)
    assert high ^ new == (1 << 45) | (1 << 59)
    with pytest.raises(fi.UnexpectedBinaryError):
        fi.patched_high(new, fi.REUSE_B_BIT)  # already patched: the bits are clear


def test_file_without_cubin_is_refused_and_left_unchanged(tmp_path):
    f = tmp_path / "not_cuda.so"
    payload = b"\x7fELF\x02\x01\x01" + bytes(200) + b"no device code here"
    f.write_bytes(payload)
    with pytest.raises(fi.UnexpectedBinaryError, match="cubin"):
        fi.patch_file(f)
    assert f.read_bytes() == payload


def test_missing_cuobjdump_is_a_typed_error(monkeypatch, tmp_path):
    monkeypatch.setattr(fi, "find_cuobjdump", lambda: None)
    with pytest.raises(fi.ToolMissingError):
        fi.disassemble(tmp_path / "x.cubin")


# ---------------------------------------------------------------------------------- real binaries
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The unpatched object, patched copies (deepgemm, all, deepgemm twice) and their listings."""
    prebuilt = os.environ.get("FP8_LINEAR_FFMA_TEST_OBJECT")
    tmp = tmp_path_factory.mktemp("ffma")
    obj = tmp / "plain.o"
    if prebuilt:
        shutil.copy(prebuilt, obj)
    else:
        cmd = ["nice", "-n", "10", jit.find_nvcc(), *jit.CUDA_FLAGS, "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
               f"-I{KERNELS / 'include'}", "-c", str(TU), "-o", str(obj)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-2000:]
    out = {"plain": obj}
    reports = {}
    for mode in fi.MODES:
        out[mode] = tmp / f"{mode}.o"
        shutil.copy(obj, out[mode])
        reports[mode] = fi.patch_file(out[mode], mode)
    out["twice"] = tmp / "twice.o"
    shutil.copy(out["deepgemm"], out["twice"])
    reports["twice"] = fi.patch_file(out["twice"], "deepgemm")
    listings = {k: fi.parse_listing(fi.disassemble(v)) for k, v in out.items()}
    return out, reports, listings


def _texts(data: bytes) -> dict[str, bytes]:
    secs = {}
    for start, length in fi.cuda_elfs(data):
        elf = data[start:start + length]
        for name, (off, size) in fi.text_sections(elf).items():
            secs[name] = elf[off:off + size]
    return secs


@needs_toolchain
@pytest.mark.slow
def test_reuse_bits_match_the_disassemblers_reuse_marks_and_yield_never_with_reuse(built):
    _, _, listings = built
    n_ffma = 0
    for code in listings["plain"].values():
        for ins in code:
            if not (ins.high >> fi.YIELD_BIT & 1):
                assert ins.high >> 58 & 0xF == 0, ins.text  # a cleared yield bit never with a reuse flag
            if ins.text.startswith("FFMA "):
                srcs = [s.strip() for s in ins.text.split(None, 1)[1].split(",")][1:4]
                for k, bit in enumerate((fi.REUSE_A_BIT, fi.REUSE_B_BIT, fi.REUSE_C_BIT)):
                    assert (".reuse" in srcs[k]) == bool(ins.high >> bit & 1), ins.text
                n_ffma += 1
    assert n_ffma > 1000


@needs_toolchain
@pytest.mark.slow
@pytest.mark.parametrize("mode", fi.MODES)
def test_only_the_yield_and_factor_reuse_bits_of_block_promotion_ffmas_change(built, mode):
    paths, reports, listings = built
    before, after = listings["plain"], listings[mode]
    assert sorted(before) == sorted(after)
    patched = {r.name: set(r.patched) for r in reports[mode]}
    assert len(patched[CFG7_BLOCK]) > 0 and CFG7_PLAIN not in patched
    n_changed = 0
    for name, code in before.items():
        new = after[name]
        assert [i.addr for i in code] == [i.addr for i in new]  # same instructions, same places
        for old, cur in zip(code, new):
            if old.addr in patched.get(name, ()):
                assert fi.block_flag(name) and old.text.startswith("FFMA ")
                assert cur.low == old.low
                diff = old.high ^ cur.high
                assert diff in ((1 << fi.YIELD_BIT) | (1 << fi.REUSE_A_BIT), (1 << fi.YIELD_BIT) | (1 << fi.REUSE_B_BIT))
                assert old.high & diff == diff  # both bits 1 -> 0
                assert old.text.count(".reuse") == cur.text.count(".reuse") + 1
                assert cur.text in _one_reuse_dropped(old.text)
                n_changed += 1
            else:
                assert (cur.low, cur.high, cur.text) == (old.low, old.high, old.text)
    assert n_changed == sum(len(v) for v in patched.values())
    # the file: same size, and the differing bytes all lie in the patched FFMAs' high words
    a, b = paths["plain"].read_bytes(), paths[mode].read_bytes()
    assert len(a) == len(b)
    changed_bytes = [i for i in range(len(a)) if a[i] != b[i]] if len(a) < 64 << 20 else []
    assert 0 < len(changed_bytes) <= 2 * n_changed


def _one_reuse_dropped(text: str) -> set[str]:
    """``text`` with one of its ``.reuse`` marks removed, each way."""
    parts = text.split(".reuse")
    return {".reuse".join(parts[:k + 1]) + parts[k + 1] + "".join(".reuse" + p for p in parts[k + 2:])
            for k in range(len(parts) - 1)}


@needs_toolchain
@pytest.mark.slow
def test_non_block_instances_are_byte_identical(built):
    paths, _, _ = built
    a, b = _texts(paths["plain"].read_bytes()), _texts(paths["all"].read_bytes())
    assert sorted(a) == sorted(b)
    plain = [n for n in a if fi.block_flag(n) is False]
    assert CFG7_PLAIN in plain and len(plain) >= 10
    for name in plain:
        assert a[name] == b[name], name
    assert any(a[n] != b[n] for n in a if fi.block_flag(n))


@needs_toolchain
@pytest.mark.slow
def test_second_run_is_idempotent(built):
    paths, reports, _ = built
    assert sum(len(r.patched) for r in reports["deepgemm"]) > 0
    assert sum(len(r.patched) for r in reports["twice"]) == 0
    assert paths["twice"].read_bytes() == paths["deepgemm"].read_bytes()
    again = paths["all"].with_name("all-again.o")
    shutil.copy(paths["all"], again)
    assert sum(len(r.patched) for r in fi.patch_file(again, "all")) == 0
    assert again.read_bytes() == paths["all"].read_bytes()


@needs_toolchain
@pytest.mark.slow
def test_a_listing_that_disagrees_with_the_bytes_is_refused(built, monkeypatch):
    """A stale listing (the patched object's SASS against the unpatched bytes): no write, a typed error."""
    paths, _, _ = built
    stale = fi.disassemble(paths["deepgemm"])
    monkeypatch.setattr(fi, "disassemble", lambda _path: stale)
    with pytest.raises(fi.UnexpectedBinaryError, match="bytes differ"):
        fi.plan(paths["plain"].read_bytes())
