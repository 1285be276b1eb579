"""Fuzz test of ``load_quantized``: seeded random mutations of a real sharded checkpoint (its
``config.json``, its index, its safetensors headers and bytes, and its files on disk). Every load must
end in a model or a ``CheckpointError``: never another exception, never a hang (a per-case alarm),
never a read of a file outside the checkpoint folder (a bait checkpoint sits next to it, see
audit_opens.py).

``FP8_FUZZ_CASES`` (default :data:`DEFAULT_CASES`) and ``FP8_FUZZ_SEED`` pick the run; a failure
prints each escaping case's number and mutations, which replay with the same seed.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import struct
import time
from collections import Counter

import pytest
import torch
from audit_opens import outside, recording_opens
from ckpt_mutations import CONFIG, HEADER_LEN_BYTES, INDEX, Snapshot, join_safetensors, split_safetensors
from tiny_models import tiny_llama, token_batch

from fp8_linear import CheckpointError, load_quantized, quantize_model, save_quantized

DEFAULT_CASES = 2000
DEFAULT_SEED = 20261201
#: Seconds one load may take before it counts as a hang (a refused load takes milliseconds).
CASE_TIMEOUT_S = 20
#: Mutations applied to each case: 1 to this many.
MAX_MUTATIONS = 3
SHARD_SIZE = "20KB"
BAIT = "bait.safetensors"

#: Values a mutation writes into a JSON field: wrong types, edge numbers, hostile strings and paths,
#: and valid values of other fields (so that mutants also reach the later checks).
POOL = [
    None, True, False, 0, 1, -1, 2, 3, 7, 64, 128, 2**31, 2**63, 10**30, -(10**9), 0.0, 0.5, -0.5, 1e-50, 1e300,
    "", "x", "Linear", "lm_head", "re:.*", "re:(", "re:(.|..)+[A-Z]$", "re:(.+)+X", "re:" + "a?" * 40 + "a" * 40,
    f"../outside/{BAIT}", "/etc/hostname", "model.safetensors", "config.json", ".", "..", "a/../../b.safetensors",
    "F8_E4M3", "F8_E5M2", "F32", "F64", "BF16", "I64", "U8", "F8_E8M0",
    "tensor", "channel", "block", "token", "group", "static", "dynamic", "float", "int", "e5m2",
    "compressed-tensors", "fp8", "fbgemm_fp8", "modelopt", "float-quantized", "int-quantized", "FP8", "compressed",
    "LlamaForCausalLM", "AutoModelForCausalLM", "BertModel", "LlamaModel", "llama", "bert", "gpt2",
    [], [1], [0, 0], [128, 128], [64, 64], [1, 64], ["Linear"], ["re:.*"], ["lm_head"], [None], [[]], {}, {"a": 1},
    {"weights": None}, "a" * 3000,
]


class Hang(BaseException):
    """Raised by the per-case alarm (a BaseException: the loader's own ``except Exception`` cannot hide it)."""


def _alarm(signum, frame):
    raise Hang()


def _paths(obj, prefix=()):
    """Every ``(container, key)`` location in a JSON tree, with its path."""
    out = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.append((obj, k, prefix + (k,)))
        out.extend(_paths(v, prefix + (k,)))
    return out


def mutate_json(obj, rng: random.Random) -> tuple[object, str]:
    """One random edit of a JSON tree (in place where possible); ``(new_root, description)``."""
    locs = _paths(obj)
    if not locs or rng.random() < 0.05:
        new = rng.choice(POOL)
        return new, f"root = {new!r:.60}"
    box, key, path = rng.choice(locs)
    old = box[key]
    op = rng.randrange(9)
    if op == 0 and isinstance(box, dict):
        del box[key]
        return obj, f"del {path}"
    if op == 1:
        box[key] = [old]
    elif op == 2:
        box[key] = old[0] if isinstance(old, list) and old else str(old)
    elif op == 3 and isinstance(old, (int, float)) and not isinstance(old, bool):
        box[key] = rng.choice([-old, old * 2**rng.randrange(1, 70), old + rng.choice([-1, 1]), float(old), str(old)])
    elif op == 4 and isinstance(box, dict):
        box[rng.choice(["x", "bogus", "__metadata__", "weight_map", "ignore", "quantization_config"])] = rng.choice(POOL)
    elif op == 5:
        other = rng.choice(locs)
        box[key] = json.loads(json.dumps(other[0][other[1]]))  # another field's value
    else:
        box[key] = rng.choice(POOL)
    return obj, f"{path} = {box[key]!r:.60}" if key in box or isinstance(box, list) else f"{path} edited"


def _raw_json_edit(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    op = rng.randrange(4)
    if op == 0:
        cut = rng.randrange(len(data) + 1)
        return data[:cut], f"truncated at {cut}"
    if op == 1:
        return b"[" * 100_000 + b"]" * 100_000, "nested 100000 deep"
    if op == 2:
        i = rng.randrange(max(len(data), 1))
        return data[:i] + bytes([rng.randrange(256)]) + data[i + 1:], f"byte {i} replaced"
    return data.replace(b"{", b'{"dup": 1, "dup": 2, ', 1), "duplicate key"


class Mutator:
    """Random damage to the files of a checkpoint folder (restored from ``snap`` before each case)."""

    def __init__(self, snap: Snapshot, root: str, rng: random.Random):
        self.snap, self.root, self.rng = snap, root, rng

    def _write(self, folder, name, data: bytes) -> None:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)

    def _read(self, folder, name) -> bytes:
        with open(os.path.join(folder, name), "rb") as f:
            return f.read()

    def json_file(self, folder, name) -> str:
        data = self._read(folder, name)
        if self.rng.random() < 0.15:
            data, what = _raw_json_edit(data, self.rng)
            self._write(folder, name, data)
            return f"{name}: {what}"
        obj, what = mutate_json(json.loads(data), self.rng)
        self._write(folder, name, json.dumps(obj).encode())
        return f"{name}: {what}"

    def header(self, folder, name) -> str:
        data = self._read(folder, name)
        header, body = split_safetensors(data)
        r = self.rng.random()
        if r < 0.6:
            new, what = mutate_json(header, self.rng)
            self._write(folder, name, join_safetensors(new, body))
            return f"{name} header: {what}"
        if r < 0.75:
            n = self.rng.choice([0, 1, 7, len(data), 2**40, 2**64 - 1, struct.unpack("<Q", data[:8])[0] + self.rng.choice([-1, 1])])
            self._write(folder, name, struct.pack("<Q", n) + data[HEADER_LEN_BYTES:])
            return f"{name}: header length {n}"
        if r < 0.9:
            cut = self.rng.randrange(len(data))
            self._write(folder, name, data[:cut])
            return f"{name}: truncated at {cut}"
        i = self.rng.randrange(HEADER_LEN_BYTES, len(data) - len(body))
        self._write(folder, name, data[:i] + bytes([self.rng.randrange(256)]) + data[i + 1:])
        return f"{name}: header byte {i} replaced"

    def data(self, folder, name) -> str:
        data = bytearray(self._read(folder, name))
        header, body = split_safetensors(bytes(data))
        start = len(data) - len(body)
        key = self.rng.choice(sorted(header.keys() - {"__metadata__"}))
        begin, end = header[key]["data_offsets"]
        if end == begin:
            return f"{name}: {key} empty"
        for _ in range(self.rng.randrange(1, 5)):
            i = start + self.rng.randrange(begin, end)
            data[i] = self.rng.choice([0x7F, 0xFF, 0x7C, 0x00, 0x80, self.rng.randrange(256)])
        self._write(folder, name, bytes(data))
        return f"{name}: bytes of {key} replaced"

    def filesystem(self, folder) -> str:
        names = sorted(os.listdir(folder))
        name = self.rng.choice(names)
        path = os.path.join(folder, name)
        op = self.rng.randrange(5)
        os.remove(path)
        if op == 0:
            return f"{name} removed"
        if op == 1:
            os.symlink(os.path.join(self.root, "outside", BAIT if name.endswith(".safetensors") else CONFIG), path)
            return f"{name} -> outside"
        if op == 2:
            os.mkfifo(path)
            return f"{name} is a FIFO"
        if op == 3:
            os.mkdir(path)
            return f"{name} is a folder"
        os.symlink(path, path)
        return f"{name} links to itself"

    def apply(self, folder) -> list[str]:
        done = []
        for _ in range(self.rng.randint(1, MAX_MUTATIONS)):
            shards = [n for n in sorted(os.listdir(folder)) if n.endswith(".safetensors") and os.path.isfile(os.path.join(folder, n))
                      and not os.path.islink(os.path.join(folder, n))]
            r = self.rng.random()
            try:
                if r < 0.35 and os.path.isfile(os.path.join(folder, CONFIG)):
                    done.append(self.json_file(folder, CONFIG))
                elif r < 0.5 and os.path.isfile(os.path.join(folder, INDEX)):
                    done.append(self.json_file(folder, INDEX))
                elif r < 0.8 and shards:
                    done.append(self.header(folder, self.rng.choice(shards)))
                elif r < 0.92 and shards:
                    done.append(self.data(folder, self.rng.choice(shards)))
                else:
                    done.append(self.filesystem(folder))
            except Exception as e:  # an earlier mutation broke what this one edits (the load still runs)
                done.append(f"(skipped: {type(e).__name__})")
        return done


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    """``(root, snapshot)``: a sharded fp8-tensor tiny Llama (1 layer) held in memory, and a bait
    checkpoint in ``root/outside`` that a load must never read."""
    root = str(tmp_path_factory.mktemp("fuzz"))
    model = quantize_model(tiny_llama(seed=7, num_hidden_layers=1), [token_batch()], "fp8-tensor", progress=False)
    folder = save_quantized(model, os.path.join(root, "base"), max_shard_size=SHARD_SIZE)
    snap = Snapshot(folder)
    os.makedirs(os.path.join(root, "outside"))
    with open(os.path.join(root, "outside", BAIT), "wb") as f:
        f.write(snap.files[snap.shards()[0]])
    with open(os.path.join(root, "outside", CONFIG), "wb") as f:
        f.write(snap.files[CONFIG])
    return root, snap


def test_fuzzed_checkpoints_load_or_raise_checkpoint_error(fuzz_root):
    root, snap = fuzz_root
    cases = int(os.environ.get("FP8_FUZZ_CASES", DEFAULT_CASES))
    rng = random.Random(int(os.environ.get("FP8_FUZZ_SEED", DEFAULT_SEED)))
    folder = os.path.join(root, "ckpt")
    mutator = Mutator(snap, root, rng)
    outcomes, escapes = Counter(), []
    quiet = logging.getLogger("fp8_linear")
    level, quiet.level = quiet.level, logging.CRITICAL
    previous = signal.signal(signal.SIGALRM, _alarm)
    t0 = time.monotonic()
    try:
        for i in range(cases):
            snap.restore(folder)
            what = mutator.apply(folder)
            with recording_opens() as opened:
                signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
                try:
                    model = load_quantized(folder, dtype=torch.float32)
                    outcomes["loaded" if isinstance(model, torch.nn.Module) else "not a model"] += 1
                except CheckpointError:
                    outcomes["refused"] += 1
                except Hang:
                    escapes.append((i, what, f"no result after {CASE_TIMEOUT_S} s"))
                except Exception as e:
                    escapes.append((i, what, f"{type(e).__name__}: {str(e)[:200]}"))
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            read_outside = outside(opened, root, folder)
            if read_outside:
                escapes.append((i, what, f"read outside the folder: {read_outside[:3]}"))
    finally:
        signal.signal(signal.SIGALRM, previous)
        quiet.level = level
    took = time.monotonic() - t0
    print(f"\nfuzz: {cases} mutated checkpoints in {took:.1f} s: {dict(outcomes)}")
    assert not escapes, "\n".join(f"case {i}: {what} -> {err}" for i, what, err in escapes[:20])
    assert outcomes["not a model"] == 0
    assert outcomes["refused"] > cases // 2 and outcomes["loaded"] > 0, dict(outcomes)
