"""Compare the SASS of two builds of the kernel, function by function (``cuobjdump -sass``).

    python -m benchmarks.tools.sass_diff old.so new.so [--show 20]   # identical / differing kernels
    python -m benchmarks.tools.sass_diff --summary build.so          # per kernel: instructions, wgmma, spills

Works without a GPU (cuobjdump reads the cubin in the shared object). Instructions are compared without
their addresses and encodings, so the same code at another offset counts as identical. Exit code 0
when every kernel of both is identical (or for ``--summary``), 1 when any differs, 2 on bad input.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_ADDRESS = re.compile(r"/\*[0-9a-fA-F]{4,}\*/")
_ENCODING = re.compile(r"/\*\s*0x[0-9a-fA-F]+\s*\*/")
#: Instructions counted by ``--summary``: Hopper's FP8 wgmma and the local-memory spill traffic.
COUNTED = {"wgmma": re.compile(r"\bQGMMA\b|\bHGMMA\b"), "spills": re.compile(r"\b(LDL|STL)\b")}


def parse_sass(text: str) -> dict[str, list[str]]:
    """``{kernel name: [instruction, ...]}`` from ``cuobjdump -sass`` output; each instruction without
    its address and encoding comments, whitespace collapsed."""
    functions: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        if current is None or not _ADDRESS.search(line):
            continue
        ins = _ENCODING.sub("", _ADDRESS.sub("", line))
        ins = " ".join(ins.split())
        if ins:
            current.append(ins)
    return functions


def dump_sass(path: str) -> str:
    """``cuobjdump -sass path``; ``FileNotFoundError`` if cuobjdump is missing, ``ValueError`` if it fails."""
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    proc = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"cuobjdump -sass {path} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout


def compare(a: dict[str, list[str]], b: dict[str, list[str]], show: int = 0) -> tuple[str, bool]:
    """A report of two parsed listings and whether they are identical (same kernels, same code)."""
    lines = []
    same = True
    for name in sorted(set(a) | set(b)):
        if name not in b or name not in a:
            lines.append(f"only in {'a' if name in a else 'b'}: {name}")
            same = False
            continue
        if a[name] == b[name]:
            lines.append(f"identical ({len(a[name])} instructions): {name}")
            continue
        same = False
        diff = [d for d in difflib.unified_diff(a[name], b[name], lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]
        lines.append(f"DIFFERS ({len(a[name])} vs {len(b[name])} instructions, {len(diff)} changed lines): {name}")
        lines += [f"    {d}" for d in diff[:show]]
    n_same = sum(1 for line in lines if line.startswith("identical"))
    lines.append(f"{n_same} of {len(set(a) | set(b))} kernels identical")
    return "\n".join(lines), same


def summary(functions: dict[str, list[str]]) -> str:
    """Per kernel: the instruction count and the :data:`COUNTED` instruction counts."""
    out = []
    for name, ins in sorted(functions.items()):
        counts = ", ".join(f"{k} {sum(1 for i in ins if rx.search(i))}" for k, rx in COUNTED.items())
        out.append(f"{len(ins):6d} instructions, {counts}: {name}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tools.sass_diff", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="two shared objects (or cubins) to compare, or one with --summary")
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--show", type=int, default=20, help="changed lines shown per differing kernel")
    args = ap.parse_args(argv)
    if len(args.files) != (1 if args.summary else 2):
        print(f"sass_diff: expected {'one file' if args.summary else 'two files'}, got {len(args.files)}", file=sys.stderr)
        return 2
    try:
        parsed = [parse_sass(dump_sass(f)) for f in args.files]
    except (OSError, ValueError) as e:
        print(f"sass_diff: {e}", file=sys.stderr)
        return 2
    if args.summary:
        print(summary(parsed[0]))
        return 0
    report, same = compare(*parsed, show=args.show)
    print(report)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
