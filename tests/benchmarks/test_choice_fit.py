"""benchmarks/choice_fit.py on the committed H200 decode results: the features against hand-computed
values, the held-out split, the fit's error on its training cells, the choice tables' invariants and
determinism. CPU only (the fit reads JSON files)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks import choice_fit as F
from fp8_linear.kernels import configs as C

#: What the fit must reproduce on its own training cells (|pred / measured - 1| over all fitted configs);
#: measured with the committed files: median 5.4%, p90 14.2%.
TRAIN_MEDIAN_MAX = 0.08
TRAIN_P90_MAX = 0.20


@pytest.fixture(scope="module")
def res():
    return F.run()


@pytest.fixture(scope="module")
def table():
    return F.load()


def test_features_by_hand():
    """Config 7 at 128 x 4096 x 4096: 32 tiles of 128 x 128 (one wave of 132), 32 k-blocks, HBM bytes
    N K + M K + 2 M N, full token rows; config 17 at M = 1, N = 16384, K = 3072 in 2 splits: 256 tiles x 2
    = 512 work items (4 waves), 12 k-blocks each, 1/16 of the token rows used."""
    assert F.features(7, 1, 128, 4096, 4096) == (1.0, 32.0, 4096 * 4096 + 128 * 4096 + 2 * 128 * 4096, 0.0, 1.0)
    w, kb, nbytes, split, used = F.features(17, 2, 1, 16384, 3072)
    assert (w, kb, split) == (4.0, 12.0, 1.0) and used == pytest.approx(1 / 16)
    th = {"a": 1.0, "b": 0.1, "h": 0.1, "g": 0.5, "bw": 1e6, "e": 2.0}
    path = 1 * 32 * (0.1 + 0.1) + 0.5 * 1
    hbm = (4096 * 4096 + 128 * 4096 + 2 * 128 * 4096) / 1e6
    want = 1.0 + (path ** F.SMOOTH_MAX_P + hbm ** F.SMOOTH_MAX_P) ** (1 / F.SMOOTH_MAX_P)
    assert F.predict(th, np.array([F.features(7, 1, 128, 4096, 4096)]))[0] == pytest.approx(want)


def test_table_has_only_current_configs_and_the_choice_labels(table):
    """Every (config, splits) key is a config of fp8_linear/kernels/configs.py (config 3 = swap128x64_4acc, removed, is
    not there); the decode-set file's recorded choice of each cell is among the cell's measurements."""
    assert all(cid in C.CONFIG_BY_ID for cell in table.values() for cid, _ in cell["meas"])
    assert 3 not in {cid for cell in table.values() for cid, _ in cell["meas"]}
    rows = json.loads((F.RESULTS / F.RESULT_FILES[0][0]).read_text())["rows"]
    for r in rows:
        choice = F._parse_choice(r["config"])
        assert choice in table[(r["layer"], r["M"], r["N"], r["K"])]["meas"]
    assert all(t > 0 for cell in table.values() for t in cell["meas"].values())


def test_heldout_split_shares_no_layer_or_shape_with_training(table):
    """Held-out cells are the three held-out models' layers and the held-out file's shapes; training cells
    are the other seven models'; no (N, K) of a held-out cell is a training layer's."""
    held = [key for key in table if F.is_heldout(key)]
    train = [key for key in table if not F.is_heldout(key)]
    models_train = {F.model_of(key[0]) for key in train}
    models_held = {F.model_of(key[0]) for key in held} - {None}
    assert models_held == set(F.HELDOUT_MODELS) and len(models_train) == 7
    assert not models_train & models_held and None not in models_train
    assert not {(n, k) for _, _, n, k in held} & {(n, k) for _, _, n, k in train}
    assert all(table[key]["heldout_file"] for key in held if F.model_of(key[0]) is None)


def test_fit_reproduces_training_cells(res):
    """Over all fitted configs, the training times are reproduced within TRAIN_MEDIAN_MAX (median) and
    TRAIN_P90_MAX (90th percentile); every config with measurements is fitted; parameters are positive."""
    err = res["train_error_all"]
    assert err["median"] < TRAIN_MEDIAN_MAX and err["p90"] < TRAIN_P90_MAX
    assert res["skipped_configs"] == []
    assert all(v >= 0 and math.isfinite(v) for th in res["params"].values() for v in th.values())
    assert res["heldout_error_all"]["cells"] > 500


def test_oracle_is_never_slower_than_the_rules(res, table):
    """The judged cells are exactly the held-out cells with the rules' choice and another fitted config
    measured; each changed cell's times are the table's (rules, model) and its measured minimum (oracle);
    so per M bucket the oracle's geomean cuBLASLt / ours is the highest."""
    judged = {}
    for key, cell in table.items():
        if not F.is_heldout(key) or cell["cublas"] is None:
            continue
        _, m, n, k = key
        cands = {cs: t for cs, t in cell["meas"].items() if str(cs[0]) in res["params"]}
        if F.rules_choice(m, n, k) in cands and len(cands) >= 2:
            judged[key] = cands
    assert len(judged) == res["choice_all"]["cells"]
    for ch in res["changed"]:
        cands = judged[(ch["layer"], ch["M"], ch["N"], ch["K"])]
        assert ch["us_oracle"] == min(cands.values()) and ch["us_rules"] == cands[tuple(ch["rules"])]
        assert ch["us_model"] == cands[tuple(ch["model"])]
    for v in res["choice"].values():
        assert v["oracle"] >= v["rules"] - 1e-12 and v["oracle"] >= v["model"] - 1e-12
    for ch in res["changed"]:
        assert ch["us_oracle"] <= min(ch["us_rules"], ch["us_model"]) and ch["rules"] != ch["model"]
        assert ch["pred_model"] <= ch["pred_rules"]


def test_results_are_deterministic(res):
    """A second run gives the same parameters, errors and tables, bit for bit."""
    assert json.dumps(F.run(), sort_keys=True) == json.dumps(res, sort_keys=True)


def test_main_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "fit.json"
    assert F.main(["--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "model argmin" in text and "| all |" in text
    assert set(json.loads(out.read_text())) >= {"params", "heldout_error_all", "choice", "changed"}
