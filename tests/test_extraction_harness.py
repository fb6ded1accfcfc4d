"""``raysim extract`` (FedBaF spec §6.2–6.3, §7.2 inv. 13) against finished runs with observers.

Full collusion recovers the foundation to float32 precision through FedAvg, FedProx's damped
server and FedAdam's replayed moments; partial collusion gives an error > 0 that is reported; the
static-α control (E0) recovers it too; results land in an MLflow run with a table and plots.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient

from raysim.actors.local import local_core
from raysim.config import load_config
from raysim.security.report import extract
from tests.conftest import tiny
from tests.test_fedbaf import foundation_for, run_cfg


def observed_run(tmp_path, algorithm, fraction=1.0, rounds=4):
    path = tmp_path / "pre.safetensors"
    foundation_for(run_cfg({"name": "fedavg"}), path)
    hooks = {"clients": [{"name": "observe", "dir": str(tmp_path / "obs"), "fraction": fraction}]}
    cfg = load_config(
        tiny(rounds=rounds, algorithm={**algorithm, "foundation": str(path)}, hooks=hooks)
    )
    core = local_core(cfg)
    while not core.done:
        core.step()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    return config, core


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "fedbaf"},
        {"name": "fedbaf", "base": "fedprox", "base_params": {"mu": 0.01}},
        {"name": "fedbaf", "base": "fedadam"},
    ],
    ids=["fedavg", "fedprox", "fedadam"],
)
def test_full_collusion_recovers_the_foundation_through_each_base(tmp_path, algorithm):
    config, _ = observed_run(tmp_path, algorithm)
    out = extract(str(config), f"sqlite:///{tmp_path / 'm.db'}", log=False)
    e2 = [a for a in out.attempts if a.attack == "E2"]
    assert len(e2) == 2 and all(a.complete for a in e2)
    assert max(a.relative_error for a in e2) < 1e-6
    assert min(a.cosine for a in e2) > 1 - 1e-9
    casts = [a for a in out.attempts if a.attack == "broadcast"]
    assert min(a.relative_error for a in casts) > 1e-2  # the broadcasts alone are far from it


def test_partial_collusion_misses_and_says_so_and_the_run_is_logged(tmp_path):
    config, _ = observed_run(tmp_path, {"name": "fedbaf"}, fraction=0.5, rounds=6)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    out = extract(str(config), uri)
    e2 = [a for a in out.attempts if a.attack == "E2"]
    assert e2 and not any(a.complete for a in e2)
    assert min(a.relative_error for a in e2) > 1e-3
    assert "E2_partial_relative_error_min" in out.summary
    e1 = [a for a in out.attempts if a.attack == "E1"]
    assert e1 and all(np.isfinite([a.cosine, a.cka]).all() for a in e1)
    assert any("line search" in a.detail for a in e1)
    client = MlflowClient(uri)
    run = client.get_run(out.run_id)
    assert run.data.metrics["E2_partial_relative_error_min"] == pytest.approx(
        out.summary["E2_partial_relative_error_min"]
    )
    names = {a.path for a in client.list_artifacts(out.run_id)}
    assert {"extraction.csv", "extraction.png", "summary.yaml"} <= names


def test_static_alpha_falls_to_e0(tmp_path):
    config, _ = observed_run(tmp_path, {"name": "fedbaf", "alpha_random": False})
    out = extract(str(config), f"sqlite:///{tmp_path / 'm.db'}", log=False)
    e0 = [a for a in out.attempts if a.attack == "E0"]
    assert e0 and max(a.relative_error for a in e0) < 1e-5


def test_a_run_without_observers_or_fedbaf_is_refused_in_one_line(tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(load_config(tiny()).to_dict()))
    with pytest.raises(ValueError, match="does not use FedBaF"):
        extract(str(plain), f"sqlite:///{tmp_path / 'm.db'}", log=False)


def test_raysim_extract_from_the_command_line(tmp_path, capsys, monkeypatch):
    from raysim import cli

    config, _ = observed_run(tmp_path, {"name": "fedbaf"})
    monkeypatch.chdir(tmp_path)
    assert cli.main(["extract", str(config)]) == 0
    out = capsys.readouterr().out
    assert "E2 full" in out and "logged as MLflow run" in out
    assert cli.main(["extract", "no-such-run"]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err
