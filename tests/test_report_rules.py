"""The papers' reports decide each claim as its spec words it (issue 62): FedOT's A2 against every
baseline, A5 on its letter, nothing across two machines; FedBaF's rounds to a threshold counted
from 1, censored runs counted and never decided on."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from raysim.verdicts import HELD, INCONCLUSIVE

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def example():
    """``example(name)``: that example's ``report`` module (its ``reproduce`` beside it)."""
    added: list[str] = []

    def load(name: str):
        for mod in ("report", "reproduce"):  # another example's modules of the same names
            sys.modules.pop(mod, None)
        path = str(EXAMPLES / name)
        sys.path.insert(0, path)
        added.append(path)
        return importlib.import_module("report")

    yield load
    for mod in ("report", "reproduce"):
        sys.modules.pop(mod, None)
    for path in added:
        sys.path.remove(path)


def fedot_cell(scores: list[float], machine: str = "AMD EPYC, 2 cores") -> dict:
    rows = [
        {"seed": s, "status": "finished", "accuracy": a, "run_id": f"r{s}"}
        for s, a in enumerate(scores)
    ]
    return {"table": rows, "machine": machine, "seconds": 60.0, "rounds": 10}


def fedot_criteria(report, results: dict, tmp_path: Path) -> dict[str, str]:
    file = tmp_path / "results.json"
    file.write_text(json.dumps(results))
    out = {}
    for line in report.Report(file).criteria():
        m = report.CRITERION.match(line)
        if m:
            out[m[1]] = (m[2], line)
    return out


def affine_cells(report, fedot_over: dict[str, list[float]]) -> dict:
    """The affine τ = 1 cells: FedOT 80 % on five seeds, each other method ``80 − gap``."""
    base = np.array([0.80, 0.81, 0.79, 0.82, 0.80])
    cells = {"affine/1/fedot": fedot_cell(list(base))}
    for m in report.METHODS:
        if m != "fedot":
            gap = np.asarray(fedot_over.get(m, [0.10, 0.12, 0.09, 0.11, 0.10]))
            cells[f"affine/1/{m}"] = fedot_cell(list(base - gap))
    return cells


def test_fedot_a2_is_decided_against_every_baseline_not_the_best_by_mean(example, tmp_path):
    """A rival whose mean is low but whose seeds scatter (Fed-FOMAML on colour τ = 1: 15.1
    [−0.7, 30.8]) kept the old report's A2 "held", since it tested only the best by mean."""
    report = example("fedot")
    clear = affine_cells(report, {"fedot_l0": [0.03, 0.04, 0.02, 0.03, 0.05]})
    got = fedot_criteria(report, clear, tmp_path)
    assert got["A2 (affine)"][0] == HELD, got["A2 (affine)"][1]
    noisy = affine_cells(
        report,
        {
            "fedot_l0": [0.03, 0.04, 0.02, 0.03, 0.05],  # the best by mean, clearly beaten
            "fed_fomaml": [0.30, -0.02, 0.25, 0.01, 0.28],  # lower mean, seeds that disagree
        },
    )
    got = fedot_criteria(report, noisy, tmp_path)
    assert got["A2 (affine)"][0] == INCONCLUSIVE, got["A2 (affine)"][1]
    assert "Fed-FOMAML" in got["A2 (affine)"][1]


def test_fedot_decides_nothing_between_cells_of_two_machines(example, tmp_path):
    report = example("fedot")
    cells = affine_cells(report, {})
    assert fedot_criteria(report, cells, tmp_path)["A1 (affine)"][0] == HELD
    cells["affine/1/fedavg"]["machine"] = "Intel(R) Xeon(R) Processor, 2 cores"
    got = fedot_criteria(report, cells, tmp_path)
    assert got["A1 (affine)"][0] == INCONCLUSIVE and "different machines" in got["A1 (affine)"][1]
    assert "(other machine)" in got["A2 (affine)"][1]


def test_fedot_a5_is_no_nan_and_the_zero_sum_invariant_whatever_collapsed(example, tmp_path):
    """§9.3's A5 is "no NaN and the zero-sum invariant"; the colour τ = 5 collapse is A4's."""
    report = example("fedot")
    cells = affine_cells(report, {})
    for label in ("affine/5/fedot", "colour/1/fedot"):
        cells[label] = fedot_cell([0.7, 0.71, 0.69, 0.72, 0.7])
    for label in ("affine/1/fedot", "affine/5/fedot", "colour/1/fedot"):
        for row in cells[label]["table"]:
            row.update(zero_sum_source="stored_heads", zero_sum_residual=1e-9)
    cells["colour/5/fedot"] = {
        "table": [],
        "diverged": ["round 3: client 2: dual_penalty past the guard"],
        "machine": "AMD EPYC, 2 cores",
        "seconds": 1.0,
    }
    got = fedot_criteria(report, cells, tmp_path)
    assert got["A5"][0] == HELD and "decided under A4" in got["A5"][1]
    cells["affine/1/fedot"]["table"][0]["zero_sum_residual"] = 1e-3
    assert fedot_criteria(report, cells, tmp_path)["A5"][0] == "not held"


def test_fedot_a_cell_diverged_again_keeps_every_attempt_s_seeds(example, tmp_path, monkeypatch):
    """Seeds added to a cell whose runs all diverged before: its earlier runs' lines are kept
    beside the new ones (an attempt's own error files only), and A4 counts them all."""
    report = example("fedot")
    import reproduce

    import raysim

    label = "colour/5/fedot"
    earlier = [f"round 13{s}: client 0's dual_penalty is 1049" for s in (5, 5, 4)]
    results = tmp_path / "results.json"
    failed = {"error": "x", "diverged": earlier, "table": [], "seconds": 10.0, "rounds": 200}
    results.write_text(json.dumps({label: {**failed, "machine": reproduce.machine()}}))
    storage = (tmp_path / "out" / "tune" / label).resolve()
    stale = storage / "an earlier attempt" / "error.txt"  # left by the first attempt
    stale.parent.mkdir(parents=True)
    stale.write_text(f"Diverged: {earlier[0]}\n")
    os.utime(stale, (0, 0))

    def tune(raw: dict, storage: Path):
        assert raw["tune"]["space"]["seed"]["grid"] == [3, 4]  # only the seeds not yet tried
        for s in (3, 4):
            error = storage / f"trial {s}" / "error.txt"
            error.parent.mkdir(parents=True)
            error.write_text(f"Traceback ...\nDiverged: round 13{s}: client 0's dual_penalty\n")
        raise RuntimeError("no trial finished with 'accuracy'")

    monkeypatch.setattr(raysim, "tune", tune)
    cell = reproduce.Reproduction(tmp_path / "out", quick=False, results=results).cell(
        "colour", 5, "fedot"
    )
    assert cell["seeds"] == [0, 1, 2, 3, 4] and cell["seconds"] >= 10.0
    added = [f"round 13{s}: client 0's dual_penalty" for s in (3, 4)]
    assert cell["diverged"] == [*earlier, *added]
    assert json.loads(results.read_text())[label] == cell
    cells = {**affine_cells(report, {}), label: cell, "colour/5/fedavg": fedot_cell([0.7] * 5)}
    got = fedot_criteria(report, cells, tmp_path)
    assert got["A4 (colour)"][0] == "not held" and "5 of 5 seeds" in got["A4 (colour)"][1]


def test_fedbaf_rounds_to_a_threshold_count_from_one_and_censor_at_t_plus_one(example, tmp_path):
    """MLflow's step is the round's number (1 to T): a run first at 85 % in round 3 took 3 rounds,
    not 4; one that never reached it in T = 4 rounds counts 5, censored, and is listed."""
    report = example("fedbaf")
    curves = {
        0: [[1, 0.50], [2, 0.80], [3, 0.86], [4, 0.90]],
        1: [[1, 0.70], [2, 0.85], [3, 0.88], [4, 0.91]],
        2: [[1, 0.40], [2, 0.60], [3, 0.70], [4, 0.84]],
    }
    rows = [
        {"seed": s, "status": "finished", "accuracy": c[-1][1], "run_id": f"r{s}",
         "history": {"accuracy": c}}
        for s, c in curves.items()
    ]  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps({"cell": {"table": rows}}))
    rep = report.Report(tmp_path)
    rounds, censored = rep.rounds_to("cell", 0.85)
    assert rounds == {0: 3.0, 1: 2.0, 2: 5.0}
    assert censored == [2]
    assert not (tmp_path / "mlflow.db").exists()  # the series came from results.json
