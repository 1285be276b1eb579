"""FFMA interleaving: a post-compile SASS pass over the block-scaled GEMM's FP32 promotion (opt-in).

DeepGEMM's finding (its README, "FFMA SASS interleaving"): in the promotion of a fine-grained-scaled FP8
GEMM (``fin += partial * factor``, one FFMA per accumulator value), clearing the yield-suppression bit
and the operand-reuse flag of some FFMAs lets the warp scheduler switch to the other consumer warpgroup
(its wgmma issue) in the middle of the promotion; ptxas 12.3 and later emit that pattern itself on
CUTLASS's FADD promotion. This module applies DeepGEMM's rule to our block instances, in place, on the
built extension ``.so`` (or a ``.o`` / cubin): it changes two control bits of selected FFMA instruction
words and nothing else.

Hopper instruction words are 128 bits, stored as two little-endian 64-bit words; the second ("high")
word holds bits 64..127, and its top 23 bits (41..63) are the scheduling control field (CuAssembler's
and maxas's decoding): stall count 41-44, yield 45, write / read barrier 46-48 / 49-51, wait mask 52-57,
operand reuse flags 58-61 (operands a, b, c, d). The bits this pass uses:

- :data:`YIELD_BIT` (high word bit 45). ptxas leaves it set on most instructions and clears it on the
  ones after which the warp may be switched out; a cleared bit never comes with a reuse flag (checked
  over all 104488 instructions of ``sm90_gemm_e4m3_e4m3.cu``, nvcc 13.0: 23129 with the bit clear, none
  of them with a reuse flag), and the per-tensor FADD promotion has it clear on every other FADD.
- :data:`REUSE_A_BIT` / :data:`REUSE_B_BIT` (high word bits 58 / 59): the reuse-cache flags of operands
  a and b; the disassembler prints them as ``.reuse`` on the first / second source, and bits 58 / 59 /
  60 match the ``.reuse`` marks of operands a / b / c on all 14424 FFMAs of that file. DeepGEMM clears
  bit 59 (its factor was operand b); ptxas 13.0 puts our factor in a or b (it commutes the product), so
  the pass clears the flag of the factor's slot (:func:`factor_slots`).

What ptxas 13.0 already does: in the k loop's promotion runs of the block instances, every other FFMA
has the yield bit clear and no reuse flag (the pattern DeepGEMM writes); the tile's last promotion
(after ``WARPGROUP.DEPBAR.LE gsb0, 0x0``) has a reuse flag and the yield bit set on nearly every FFMA.

Which FFMAs (DeepGEMM's rule, its ``interleave_ffma.py`` of early 2025, rewritten): in a kernel whose
template flag BLK is 1 (:data:`BLOCK_FLAG_ARG`), a *promotion run* is a maximal sequence of at least
:data:`MIN_RUN` consecutive unpredicated FFMAs that all accumulate in place (``FFMA Rd, Ra, Rb, Rd``).
Of the first :data:`RUN_FRACTION` of each run (rounded down to an even count), an FFMA whose factor
operand carries the reuse flag is patched (that flag and the yield bit cleared) when its factor register
has not occurred earlier in the run, or when the FFMA before it kept its own reuse flag on the same
factor register; otherwise it keeps the flag (so within one factor register's FFMAs the patched ones
alternate). Mode ``all`` patches every reuse-flagged factor FFMA of every promotion run instead.

The pass locates each kernel's ``.text`` section in every CUDA ELF embedded in the file (no byte-pattern
search), checks that the bytes there equal cuobjdump's encodings instruction for instruction, and
raises a :class:`FfmaInterleaveError` subclass, leaving the file untouched, when anything does not look
as expected. Running it twice changes nothing the second time.

    python -m fp8_linear.kernels.jit.ffma_interleave build.so [--mode deepgemm|all] [--dry-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile

#: Environment switch read by :func:`requested_mode` (``fp8_linear.kernels.jit.load``): ``1`` or
#: ``deepgemm`` applies DeepGEMM's rule, ``all`` every reuse-flagged promotion FFMA; unset / ``0`` off.
ENV = "FP8_LINEAR_FFMA_INTERLEAVE"
MODES = ("deepgemm", "all")

INSTRUCTION_BYTES = 16  #: one sm_90 instruction: two little-endian 64-bit words
YIELD_BIT = 45  #: high-word bit: set = no yield hint (ptxas's default), cleared = the warp may yield
REUSE_A_BIT, REUSE_B_BIT, REUSE_C_BIT = 58, 59, 60  #: high-word operand reuse flags (a, b, c)
#: The only bits this pass changes (1 -> 0): the yield bit and the factor operand's reuse flag (a or b).
PATCH_BITS = (YIELD_BIT, REUSE_A_BIT, REUSE_B_BIT)

MIN_RUN = 8  #: DeepGEMM's segment threshold: 16 cuobjdump lines = 8 FFMAs
RUN_FRACTION = (9, 16)  #: DeepGEMM's share of a run considered (its "slight gain, roughly 0.5%")

#: Kernels with block-scaled instances and the 0-based index of their BLK template argument
#: (sm90_gemm.cuh ``fp8_gemm_sm90_kernel<BN, SWAP, NACC, FA, FB, DBL, SPLIT, BLK, BM>``,
#: sm90_grouped.cuh ``fp8_grouped_sm90_kernel<BN, NACC, FW, FX, DBL, BLK>``).
BLOCK_FLAG_ARG = {"fp8_gemm_sm90_kernel": 7, "fp8_grouped_sm90_kernel": 5}

EM_CUDA = 190  #: ELF e_machine of a cubin
_ELF_MAGIC = b"\x7fELF"
_TEMPLATE = re.compile(r"\d(fp8_(?:gemm|grouped)_sm90_kernel)I((?:L[a-z]+n?\d+E)+)E")
_TEMPLATE_ARG = re.compile(r"L[a-z]+(n?\d+)E")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTR = re.compile(r"/\*([0-9a-fA-F]{4,})\*/\s*(.*?)\s*;\s*/\*\s*(0x[0-9a-fA-F]{16})\s*\*/")
_HIGH = re.compile(r"^\s*/\*\s*(0x[0-9a-fA-F]{16})\s*\*/\s*$")
_FFMA = re.compile(r"^FFMA\s+(R\d+),\s*(-?\|?R\d+\|?)(?:\.reuse)?,\s*(-?\|?R\d+\|?)(?:\.reuse)?,\s*(-?R\d+)(?:\.reuse)?$")


class FfmaInterleaveError(RuntimeError):
    """The binary was not patched (the reason in the message); the file is unchanged."""


class ToolMissingError(FfmaInterleaveError):
    """cuobjdump is not installed (set ``CUOBJDUMP`` or put the CUDA toolkit's bin on ``PATH``)."""


class UnexpectedBinaryError(FfmaInterleaveError):
    """No CUDA ELF, no block instance, a compressed fatbin, or listing and bytes that disagree."""


@dataclasses.dataclass(frozen=True)
class Instruction:
    addr: int  #: byte offset inside the kernel's .text section
    text: str  #: the disassembly without address and encodings
    low: int
    high: int


@dataclasses.dataclass
class KernelReport:
    name: str
    ffma_runs: int = 0  #: promotion runs found
    ffmas_in_runs: int = 0
    patched: list[int] = dataclasses.field(default_factory=list)  #: addresses of patched FFMAs


def find_cuobjdump() -> str | None:
    """Path of cuobjdump: ``$CUOBJDUMP``, ``PATH``, ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``; or None."""
    cands = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            cands.append(str(pathlib.Path(home) / "bin" / "cuobjdump"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def requested_mode() -> str | None:
    """The mode asked for by ``FP8_LINEAR_FFMA_INTERLEAVE`` (None when off); ValueError on a bad value."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in ("", "0", "off", "false"):
        return None
    if raw in ("1", "on", "true", "deepgemm"):
        return "deepgemm"
    if raw == "all":
        return "all"
    raise ValueError(f"{ENV}={raw!r}: expected 0, 1 (deepgemm) or all")


def block_flag(name: str) -> bool | None:
    """Whether mangled kernel ``name`` is a block-scaled instance (BLK = 1); None if not one of ours."""
    m = _TEMPLATE.search(name)
    if not m:
        return None
    args = _TEMPLATE_ARG.findall(m.group(2))
    idx = BLOCK_FLAG_ARG[m.group(1)]
    if len(args) <= idx:
        return None
    return args[idx] == "1"


# ---------------------------------------------------------------------------------------------- ELF
def cuda_elfs(data: bytes) -> list[tuple[int, int]]:
    """``(offset, length)`` of every 64-bit little-endian CUDA ELF (cubin) embedded in ``data``."""
    found = []
    pos = data.find(_ELF_MAGIC)
    while pos != -1:
        hdr = data[pos:pos + 64]
        if len(hdr) == 64 and hdr[4] == 2 and hdr[5] == 1 and struct.unpack_from("<H", hdr, 0x12)[0] == EM_CUDA:
            phoff, shoff = struct.unpack_from("<QQ", hdr, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", hdr, 0x36)
            end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            for i in range(shnum):
                sh = pos + shoff + i * shentsize
                if sh + 64 > len(data):
                    break
                s_type, = struct.unpack_from("<I", data, sh + 4)
                s_off, s_size = struct.unpack_from("<QQ", data, sh + 24)
                if s_type != 8:  # SHT_NOBITS occupies no bytes
                    end = max(end, s_off + s_size)
            if shentsize == 64 and pos + end <= len(data):
                found.append((pos, end))
                pos = data.find(_ELF_MAGIC, pos + end)
                continue
        pos = data.find(_ELF_MAGIC, pos + 1)
    return found


def text_sections(elf: bytes) -> dict[str, tuple[int, int]]:
    """``{kernel name: (offset, size)}`` of the ``.text.<name>`` sections of one cubin."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    str_off = heads[shstrndx][4]
    out = {}
    for name_off, _type, _flags, _addr, off, size in heads:
        end = elf.index(b"\0", str_off + name_off)
        sec = elf[str_off + name_off:end].decode()
        if sec.startswith(".text."):
            out[sec[len(".text."):]] = (off, size)
    return out


# ------------------------------------------------------------------------------------------ listing
def parse_listing(text: str) -> dict[str, list[Instruction]]:
    """``{kernel name: [Instruction, ...]}`` from ``cuobjdump -sass`` output (both encoding words)."""
    functions: dict[str, list[Instruction]] = {}
    current = None
    pending = None
    for line in text.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = functions.setdefault(m.group(1), [])
            pending = None
            continue
        if current is None:
            continue
        m = _INSTR.search(line)
        if m:
            pending = (int(m.group(1), 16), " ".join(m.group(2).split()), int(m.group(3), 16))
            continue
        m = _HIGH.match(line)
        if m and pending is not None:
            current.append(Instruction(pending[0], pending[1], pending[2], int(m.group(1), 16)))
            pending = None
    return functions


def disassemble(path: str | os.PathLike) -> str:
    """``cuobjdump -sass path``; :class:`ToolMissingError` / :class:`UnexpectedBinaryError` on failure."""
    tool = find_cuobjdump()
    if tool is None:
        raise ToolMissingError("cuobjdump not found (set CUOBJDUMP, or CUDA_HOME with bin/cuobjdump)")
    proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UnexpectedBinaryError(f"cuobjdump -sass {path} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout


# -------------------------------------------------------------------------------------- selection
def _ffma_operands(ins: Instruction) -> tuple[str, str, str, str] | None:
    m = _FFMA.match(ins.text.replace(".reuse", ""))
    return m.groups() if m else None


def promotion_runs(code: list[Instruction]) -> list[list[int]]:
    """Indices of each promotion run: >= MIN_RUN consecutive unpredicated in-place FFMAs."""
    runs, cur = [], []
    for i, ins in enumerate(code + [Instruction(-1, "", 0, 0)]):
        ops = _ffma_operands(ins)
        if ops is not None and ops[0] == ops[3]:
            cur.append(i)
            continue
        if len(cur) >= MIN_RUN:
            runs.append(cur)
        cur = []
    return runs


def factor_slots(code: list[Instruction], run: list[int]) -> dict[int, int]:
    """``{index: reuse bit}`` for the run's FFMAs whose factor operand is known: the source (a or b)
    whose register other FFMAs of the run read too, the other source read once (an accumulator value).
    DeepGEMM's SASS had the factor in operand b; ptxas 13.0 commutes it into a in some runs."""
    counts: dict[str, int] = {}
    for i in run:
        _, a, b, _ = _ffma_operands(code[i])
        for r in {a, b}:
            counts[r] = counts.get(r, 0) + 1
    slots = {}
    for i in run:
        _, a, b, _ = _ffma_operands(code[i])
        if counts[a] > 1 and counts[b] == 1:
            slots[i] = REUSE_A_BIT
        elif counts[b] > 1 and counts[a] == 1:
            slots[i] = REUSE_B_BIT
    return slots


def select(code: list[Instruction], run: list[int], mode: str) -> dict[int, int]:
    """``{index into code: reuse bit to clear}`` of the run's FFMAs to patch (DeepGEMM's rule, or ``all``)."""
    slots = factor_slots(code, run)
    if mode == "all":
        return {i: bit for i, bit in slots.items() if code[i].high >> bit & 1}
    n = len(run) * RUN_FRACTION[0] // RUN_FRACTION[1] // 2 * 2
    chosen, seen = {}, set()
    prev_kept, prev_f = False, None
    for i in run[:n]:
        bit = slots.get(i)
        ops = _ffma_operands(code[i])
        f = None if bit is None else ops[1 if bit == REUSE_A_BIT else 2]
        kept = bit is not None and bool(code[i].high >> bit & 1)
        if kept and (f not in seen or (prev_kept and f == prev_f)):
            chosen[i] = bit
            kept = False
        seen.add(f)
        prev_kept, prev_f = kept, f
    return chosen


def patched_high(high: int, reuse_bit: int = REUSE_B_BIT) -> int:
    """The high word with the factor operand's reuse flag and the yield-suppression bit cleared."""
    if reuse_bit not in PATCH_BITS[1:]:
        raise ValueError(f"reuse bit {reuse_bit}: the pass clears only bits {PATCH_BITS}")
    mask = (1 << YIELD_BIT) | (1 << reuse_bit)
    if high & mask != mask:
        raise UnexpectedBinaryError(f"FFMA control word {high:#018x}: expected bits {reuse_bit} and {YIELD_BIT} set")
    return high & ~mask


# ------------------------------------------------------------------------------------------- pass
def plan(data: bytes, mode: str = "deepgemm") -> tuple[dict[int, bytes], list[KernelReport]]:
    """What :func:`patch_file` would write: ``{file offset: new 8-byte high word}`` and a report per
    block kernel. Raises :class:`FfmaInterleaveError` when the binary does not look as expected."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {MODES}")
    elfs = cuda_elfs(data)
    if not elfs:
        raise UnexpectedBinaryError("no uncompressed sm_90 cubin in the file (a compressed fatbin? "
                                    "build with nvcc --no-compress)")
    writes: dict[int, bytes] = {}
    reports: list[KernelReport] = []
    with tempfile.TemporaryDirectory(prefix="ffma-") as tmp:
        for n, (start, length) in enumerate(elfs):
            elf = data[start:start + length]
            sections = {k: v for k, v in text_sections(elf).items() if block_flag(k)}
            if not sections:
                continue
            cubin = pathlib.Path(tmp) / f"{n}.cubin"
            cubin.write_bytes(elf)
            listing = parse_listing(disassemble(cubin))
            for name, (off, size) in sorted(sections.items()):
                code = listing.get(name)
                if not code:
                    raise UnexpectedBinaryError(f"cuobjdump lists no SASS for {name}")
                for ins in code:
                    at = off + ins.addr
                    if at + INSTRUCTION_BYTES > off + size or elf[at:at + 16] != struct.pack("<QQ", ins.low, ins.high):
                        raise UnexpectedBinaryError(f"{name}+{ins.addr:#x}: bytes differ from the listing's encoding")
                rep = KernelReport(name)
                for run in promotion_runs(code):
                    rep.ffma_runs += 1
                    rep.ffmas_in_runs += len(run)
                    for i, bit in select(code, run, mode).items():
                        writes[start + off + code[i].addr + 8] = struct.pack("<Q", patched_high(code[i].high, bit))
                        rep.patched.append(code[i].addr)
                reports.append(rep)
    if not reports:
        raise UnexpectedBinaryError("no block-scaled kernel instance (BLK template flag 1) in the file")
    if not any(r.ffma_runs for r in reports):
        raise UnexpectedBinaryError("block instances found, but no FFMA promotion run in their SASS")
    return writes, reports


def patch_file(path: str | os.PathLike, mode: str = "deepgemm", dry_run: bool = False) -> list[KernelReport]:
    """Patch the block instances' promotion FFMAs of ``path`` (.so / .o / .cubin) in place (atomically:
    a temporary file replaces it). Returns one :class:`KernelReport` per block kernel; on
    :class:`FfmaInterleaveError` the file is left as it was."""
    path = pathlib.Path(path)
    data = path.read_bytes()
    writes, reports = plan(data, mode)
    if dry_run or not writes:
        return reports
    out = bytearray(data)
    for at, word in writes.items():
        out[at:at + 8] = word
    tmp = path.with_name(path.name + ".ffma-tmp")
    tmp.write_bytes(bytes(out))
    shutil.copymode(path, tmp)
    os.replace(tmp, path)
    return reports


def summary(reports: list[KernelReport]) -> str:
    lines = [f"{len(r.patched):4d} of {r.ffmas_in_runs:4d} FFMAs in {r.ffma_runs:2d} runs: {r.name}" for r in reports]
    lines.append(f"{sum(len(r.patched) for r in reports)} FFMAs patched in {len(reports)} block kernels")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- JIT integration
def pass_digest() -> str:
    """Short hash of this file: part of the patched build's folder name."""
    return hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:8]


def load_patched(mode: str, verbose: bool = False):
    """The extension with the pass applied (``fp8_linear.kernels.jit.load`` when :data:`ENV` is set).

    The unpatched build (its usual folder, built in a child process if missing so that this process
    never imports it) is copied to ``sm90-<key>-ffma-<mode>-<pass digest>`` and patched there; the
    module keeps the unpatched build's name. On :class:`FfmaInterleaveError` it warns and imports the
    unpatched build."""
    from . import _MARKER, _import_built, build_dir, cache_key

    key = cache_key()
    name = f"fp8_linear_sm90_{key}"
    plain = build_dir(key)
    if not (plain / _MARKER).exists():
        env = {k: v for k, v in os.environ.items() if k != ENV}
        code = f"import {__package__} as j; j.load(verbose={bool(verbose)})"
        proc = subprocess.run([sys.executable, "-c", code], env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"fp8_linear: the unpatched sm90 build failed (exit {proc.returncode})")
    folder = plain.parent / f"{plain.name}-ffma-{mode}-{pass_digest()}"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / _MARKER).exists():
        sos = sorted(plain.glob(f"{name}*.so"))
        if len(sos) != 1:
            raise RuntimeError(f"fp8_linear: expected one {name}*.so in {plain}, found {len(sos)}")
        target = folder / sos[0].name
        shutil.copy2(sos[0], target)
        try:
            reports = patch_file(target, mode)
        except FfmaInterleaveError as exc:
            target.unlink()
            (folder / "ffma_interleave.failed").write_text(f"{exc}\n")
            print(f"fp8_linear: FFMA interleaving not applied ({exc}); using the unpatched build",
                  file=sys.stderr, flush=True)
            return _import_built(name, plain)
        (folder / "ffma_interleave.txt").write_text(summary(reports) + "\n")
        (folder / _MARKER).write_text(f"patched copy of {sos[0]} (mode {mode})\n")
        print(f"fp8_linear: FFMA interleaving ({mode}): {sum(len(r.patched) for r in reports)} FFMAs "
              f"in {len(reports)} block kernels ({folder})", file=sys.stderr, flush=True)
    mod = _import_built(name, folder)
    if mod is None:
        raise RuntimeError(f"fp8_linear: no built library in {folder}")
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="extension .so, object .o or .cubin (patched in place)")
    ap.add_argument("--mode", choices=MODES, default="deepgemm")
    ap.add_argument("--dry-run", action="store_true", help="report what would change, write nothing")
    args = ap.parse_args(argv)
    try:
        reports = patch_file(args.path, args.mode, args.dry_run)
    except FfmaInterleaveError as exc:
        print(f"not patched: {exc}", file=sys.stderr)
        return 2
    print(summary(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
