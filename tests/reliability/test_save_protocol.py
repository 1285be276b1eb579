"""The save protocol (docs/checkpoints.md): a save never deletes what it did not write, the target
always names a complete checkpoint (old or new), an interrupted save is recovered, temporary names
are short, permissions follow the umask, and a load racing a save sees one consistent checkpoint
or fails clearly."""

from __future__ import annotations

import os
import stat
import threading

import pytest
import torch
from tiny_models import tiny_llama, token_batch

from fp8_linear import CheckpointError, FP8Linear, load_quantized, quantize_model, save_quantized
from fp8_linear.checkpoint import CheckpointExistsError, INCOMPLETE_MARKER
from fp8_linear.checkpoint import swap
from fp8_linear.checkpoint.save import CHECKPOINT_FILE_PATTERNS

X = token_batch(1, 12, seed=3)
#: Rounds of the save / load race (each save rewrites every shard of a sharded checkpoint).
RACE_ROUNDS = 12


@pytest.fixture(scope="module")
def models():
    """Two different quantized tiny Llamas (fp8-channel, fp8-dynamic) and their logits on ``X``."""
    a = quantize_model(tiny_llama(seed=40), [token_batch()], "fp8-channel", progress=False)
    b = quantize_model(tiny_llama(seed=41), [token_batch()], "fp8-dynamic", progress=False)
    with torch.no_grad():
        return (a, a(X).logits), (b, b(X).logits)


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    """A real tokenizer (MiniLM's: ``tokenizer.json`` and friends) to save alongside."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_dir)


def _logits(folder) -> torch.Tensor:
    with torch.no_grad():
        return load_quantized(folder, dtype=torch.float32)(X).logits


def _work_entries(parent) -> list[str]:
    return [f for f in os.listdir(parent) if f.startswith(swap.WORK_PREFIX)]


def _tree(folder) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = fh.read()
    return out


def test_overwrite_refuses_a_folder_that_is_not_a_checkpoint(models, tmp_path):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "notes.txt").write_text("keep me")
    (project / "src" / "main.py").write_text("print(1)")
    before = _tree(project)
    with pytest.raises(CheckpointExistsError, match="overwrite=True replaces only a checkpoint folder.*not a checkpoint"):
        save_quantized(models[0][0], project, overwrite=True)
    assert _tree(project) == before and _work_entries(tmp_path) == []


def test_overwrite_refuses_a_checkpoint_holding_other_files(models, tmp_path):
    target = save_quantized(models[0][0], tmp_path / "ckpt")
    with open(os.path.join(target, "notes.txt"), "w") as f:
        f.write("mine")
    os.mkdir(os.path.join(target, "runs"))
    with pytest.raises(CheckpointExistsError, match=r"holds 'notes.txt', 'runs/', which are not checkpoint files"):
        save_quantized(models[1][0], target, overwrite=True)
    assert torch.equal(_logits(target), models[0][1])
    assert open(os.path.join(target, "notes.txt")).read() == "mine"


def test_overwrite_replaces_a_checkpoint_and_leaves_nothing_else(models, tmp_path):
    target = save_quantized(models[0][0], tmp_path / "ckpt")
    save_quantized(models[1][0], target, overwrite=True)
    assert torch.equal(_logits(target), models[1][1])
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_overwrite_replaces_a_plain_transformers_checkpoint(models, tmp_path):
    """A folder another tool wrote (``save_pretrained`` of an unquantized model: config + weights +
    generation config) is a checkpoint: overwrite replaces it."""
    target = tmp_path / "plain"
    tiny_llama(seed=3).save_pretrained(target)
    save_quantized(models[0][0], target, overwrite=True)
    assert torch.equal(_logits(target), models[0][1])


def test_checkpoint_file_patterns_cover_what_save_writes(models, tokenizer, tmp_path):
    from fnmatch import fnmatchcase

    target = save_quantized(models[0][0], tmp_path / "ckpt", tokenizer=tokenizer, max_shard_size="40KB")
    names = os.listdir(target)
    assert "model.safetensors.index.json" in names and "tokenizer.json" in names
    assert all(any(fnmatchcase(n, p) for p in CHECKPOINT_FILE_PATTERNS) for n in names), names


class _ConcurrentWriter:
    """Stands in for a tokenizer: while the save runs (at ``tokenizer.save_pretrained``), another
    writer puts ``notes.txt`` into the target folder (creating it when needed)."""

    def __init__(self, target):
        self.target = target

    def save_pretrained(self, folder):
        os.makedirs(self.target, exist_ok=True)
        with open(os.path.join(self.target, "notes.txt"), "w") as f:
            f.write("written while the save ran")


def test_folder_created_by_another_writer_during_the_save_is_kept(models, tmp_path):
    target = str(tmp_path / "ckpt")
    with pytest.raises(CheckpointExistsError, match="not empty"):
        save_quantized(models[0][0], target, tokenizer=_ConcurrentWriter(target))
    assert os.listdir(target) == ["notes.txt"] and _work_entries(tmp_path) == []


def test_file_added_to_the_old_checkpoint_during_an_overwrite_is_kept(models, tmp_path):
    target = save_quantized(models[0][0], tmp_path / "ckpt")
    with pytest.raises(CheckpointExistsError, match="not checkpoint files"):
        save_quantized(models[1][0], target, tokenizer=_ConcurrentWriter(target), overwrite=True)
    assert open(os.path.join(target, "notes.txt")).read() == "written while the save ran"
    assert torch.equal(_logits(target), models[0][1]) and _work_entries(tmp_path) == []


class _Interrupt:
    """Stands in for a tokenizer whose ``save_pretrained`` is interrupted (Ctrl-C during the save)."""

    def save_pretrained(self, folder):
        raise KeyboardInterrupt


def test_interrupted_overwrite_keeps_the_old_checkpoint(models, tmp_path):
    target = save_quantized(models[0][0], tmp_path / "ckpt")
    with pytest.raises(KeyboardInterrupt):
        save_quantized(models[1][0], target, tokenizer=_Interrupt(), overwrite=True)
    assert torch.equal(_logits(target), models[0][1])
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_swap_interrupted_between_two_renames_is_recovered(models, tmp_path):
    """Where names cannot be exchanged, the swap is two renames after a journal. Stopped between them
    (target moved aside, new folder not yet in), the target is missing: a load says where the old
    checkpoint is, and the next save puts it back before replacing it."""
    target = save_quantized(models[0][0], tmp_path / "ckpt")
    work = swap.new_work_dir(str(tmp_path))
    save_quantized(models[1][0], os.path.join(work, "new"))
    # the first steps of swap.two_rename_swap, as a process killed after its first rename leaves them
    old = swap.new_work_dir(str(tmp_path))
    os.rmdir(old)
    with open(old + swap.JOURNAL_SUFFIX, "w") as f:
        f.write('{"target": "ckpt", "old": "%s", "new": "%s"}' % (os.path.basename(old), os.path.basename(work)))
    os.rename(target, old)
    with pytest.raises(CheckpointError, match="interrupted save moved the previous checkpoint to .*restores it"):
        load_quantized(target)
    with swap.DirLock(str(tmp_path)):
        swap.recover(target)
    assert torch.equal(_logits(target), models[0][1])
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_two_rename_fallback_replaces_the_checkpoint(models, tmp_path, monkeypatch):
    """On a file system without ``RENAME_EXCHANGE`` (``renameat2`` unavailable) the journaled two-rename
    swap does the overwrite and leaves nothing behind."""
    target = save_quantized(models[0][0], tmp_path / "ckpt")
    monkeypatch.setattr(swap, "_RENAMEAT2", None)
    save_quantized(models[1][0], target, overwrite=True)
    assert torch.equal(_logits(target), models[1][1])
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_250_character_folder_name(models, tmp_path):
    target = save_quantized(models[0][0], tmp_path / ("c" * 250))
    save_quantized(models[1][0], target, overwrite=True)
    assert torch.equal(_logits(target), models[1][1])


def test_folder_name_longer_than_name_max_is_refused(models, tmp_path):
    with pytest.raises(CheckpointError, match="path: expected a folder name of 1 to 255 bytes, got 300"):
        save_quantized(models[0][0], tmp_path / ("c" * 300))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("umask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_permissions_follow_the_umask(models, tokenizer, tmp_path, umask, file_mode, dir_mode):
    previous = os.umask(umask)
    try:
        target = save_quantized(models[0][0], tmp_path / "out" / "ckpt", tokenizer=tokenizer, max_shard_size="40KB")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(target).st_mode) == dir_mode
    assert stat.S_IMODE(os.stat(tmp_path / "out").st_mode) == dir_mode
    modes = {f: stat.S_IMODE(os.stat(os.path.join(target, f)).st_mode) for f in os.listdir(target)}
    assert set(modes.values()) == {file_mode}, modes


def test_meta_model_is_refused(tmp_path):
    from accelerate import init_empty_weights

    with init_empty_weights():
        model = tiny_llama()
    for name, mod in list(model.named_modules()):
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child,
                    FP8Linear(mod.in_features, mod.out_features, False, "fp8-dynamic", device="meta"))
    with pytest.raises(CheckpointError, match="model: expected real weights, got .* on the meta device"):
        save_quantized(model, tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []


def test_bad_max_shard_size(models, tmp_path):
    with pytest.raises(ValueError, match="max_shard_size: expected a positive int of bytes or a size like '5GB', got 'big'"):
        save_quantized(models[0][0], tmp_path / "ckpt", max_shard_size="big")


def test_load_racing_saves_sees_one_checkpoint(models, tmp_path):
    """Saves alternate two models into one folder while loads run: every load returns exactly one
    of the two models, or fails with an error saying a concurrent save replaced it."""
    target = save_quantized(models[0][0], tmp_path / "ckpt", max_shard_size="40KB")
    stop, errors = threading.Event(), []

    def saver():
        try:
            for i in range(RACE_ROUNDS):
                save_quantized(models[(i + 1) % 2][0], target, overwrite=True, max_shard_size="40KB")
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            stop.set()

    thread = threading.Thread(target=saver)
    thread.start()
    seen, refused = set(), 0
    while not stop.is_set():
        try:
            y = _logits(target)
        except CheckpointError as e:
            assert "concurrent save" in str(e) or INCOMPLETE_MARKER in str(e), str(e)
            refused += 1
            continue
        which = [i for i, (_, ref) in enumerate(models) if torch.equal(y, ref)]
        assert len(which) == 1, "a load mixed the files of two checkpoints"
        seen.add(which[0])
    thread.join()
    assert errors == []
    assert seen, f"no load completed ({refused} refused)"
    assert _work_entries(tmp_path) == []


def test_concurrent_saves_into_one_target(models, tmp_path):
    """Two threads overwrite one target: each save succeeds, the result is one complete checkpoint."""
    target = save_quantized(models[0][0], tmp_path / "ckpt")
    errors = []

    def run(i):
        try:
            for _ in range(3):
                save_quantized(models[i][0], target, overwrite=True)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    y = _logits(target)
    assert any(torch.equal(y, ref) for _, ref in models)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_nan_fp8_weight_is_refused_at_save(models, tmp_path):
    """A load would refuse an FP8 weight holding NaN bytes, so the save refuses to write it."""
    import copy

    model = copy.deepcopy(models[0][0])
    w = model.model.layers[0].mlp.up_proj.weight
    w.data.view(torch.uint8).view(-1)[7] = 0x7F  # e4m3fn NaN
    with pytest.raises(CheckpointError, match=r"model.model.layers.0.mlp.up_proj.weight: expected finite e4m3 values, "
                                              r"got 1 NaN/inf entries \(first at flat index 7\)"):
        save_quantized(model, tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []


def test_overwrite_replaces_a_hub_local_dir_download(models, tmp_path):
    """``hf download --local-dir`` leaves ``.cache/huggingface/`` metadata in the folder: still a checkpoint."""
    target = save_quantized(models[0][0], tmp_path / "ckpt")
    os.makedirs(os.path.join(target, ".cache", "huggingface", "download"))
    save_quantized(models[1][0], target, overwrite=True)
    assert torch.equal(_logits(target), models[1][1]) and not os.path.exists(os.path.join(target, ".cache"))
