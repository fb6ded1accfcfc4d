"""Code runs only from where the user put it (issue 56, item 2): a dry run imports no module a
config names, and a config read from a checkpoint or an MLflow run imports its modules only
when the user says they trust it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from raysim.algorithms.registry import module_policy
from raysim.config import ConfigError, has_unchecked, load_config
from raysim.state import checkpoint
from tests.conftest import ROOT, tiny

ECHO = ROOT / "tests" / "plugins" / "echo_method.py"


def _marking_module(tmp_path: Path) -> tuple[Path, Path]:
    """A user's module that registers a method and, when imported, writes a file."""
    mark = tmp_path / "imported.txt"
    module = tmp_path / "marking_method.py"
    module.write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            Path({str(mark)!r}).write_text("this module ran")
            from raysim.algorithms import ClientAlgorithm, Method, MethodParams, register
            from raysim.algorithms.general.fedavg import FedAvg

            class MarkParams(MethodParams):
                boost: float = 1.0

            register(Method(name="marking", strategy=FedAvg, params=MarkParams,
                            client=ClientAlgorithm, reference="tests"))
            """
        )
    )
    return module, mark


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raysim.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_dry_run_of_a_config_whose_module_writes_a_file_writes_nothing(tmp_path) -> None:
    module, mark = _marking_module(tmp_path)
    cfg = tiny(algorithm={"name": "marking", "module": str(module), "boost": 2.0})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    before = sorted(p.name for p in tmp_path.iterdir())
    done = _cli("run", str(path), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not mark.exists(), "a dry run imported the config's module"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written at all
    assert "marking" in done.stdout and "imports no module" in done.stdout


def test_dry_run_still_finds_mistakes_and_missing_modules(tmp_path) -> None:
    with module_policy("skip"):
        with pytest.raises(ConfigError, match="no such file"):
            load_config(tiny(algorithm={"name": "x", "module": str(tmp_path / "none.py")}))
        with pytest.raises(ConfigError, match="cannot be found"):
            load_config(tiny(algorithm={"name": "x", "module": "no_such_pkg_here.mod"}))
        with pytest.raises(ConfigError, match="rounds"):  # the rest is still checked
            load_config({**tiny(algorithm={"name": "x", "module": str(ECHO)}), "rounds": -1})
        cfg = load_config(tiny(algorithm={"name": "fedavg"}))
        assert not has_unchecked(cfg)


def test_a_checkpoint_config_naming_a_module_needs_trust(tmp_path) -> None:
    module, mark = _marking_module(tmp_path)
    cfg = tiny(algorithm={"name": "marking", "module": str(module)}, tracking={"enabled": False})
    ckpt = tmp_path / "ckpt"
    files = checkpoint.pack({"round": 0}, cfg, 1, None)
    checkpoint.write_dir(ckpt, files)
    with pytest.raises(ConfigError, match="--trust-modules"):
        checkpoint.prepare_resume(ckpt)
    assert not mark.exists()
    with module_policy("skip"):  # a dry run of the resume: checked, not run
        checkpoint.prepare_resume(ckpt)
    assert not mark.exists()
    source = checkpoint.prepare_resume(ckpt, trust_modules=True)
    assert mark.exists() and source.config.algorithm.name == "marking"


def test_resume_dry_run_from_the_cli_runs_no_module(tmp_path) -> None:
    module, mark = _marking_module(tmp_path)
    ckpt = tmp_path / "ckpt"
    cfg = tiny(algorithm={"name": "marking", "module": str(module)}, tracking={"enabled": False})
    checkpoint.write_dir(ckpt, checkpoint.pack({"round": 0}, cfg, 1, None))
    refused = _cli("run", "--resume", str(ckpt), cwd=tmp_path)
    assert refused.returncode != 0 and "--trust-modules" in refused.stderr
    assert "Traceback" not in refused.stderr
    dry = _cli("run", "--resume", str(ckpt), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert not mark.exists()


def test_tune_dry_run_runs_no_module(tmp_path) -> None:
    module, mark = _marking_module(tmp_path)
    cfg = tiny(
        algorithm={"name": "marking", "module": str(module)},
        workers={"count": 1, "num_cpus": 0.5},
        tune={"space": {"algorithm.boost": {"grid": [1.0, 2.0]}}},
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = _cli("tune", str(path), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not mark.exists() and "does not import" in done.stdout


def test_extract_of_an_mlflow_run_naming_a_module_needs_trust(tmp_path) -> None:
    """``raysim extract RUN_ID`` reads the run's config.yaml back from MLflow: a module it names
    is not a file the user gave, so it is imported only with trust."""
    from mlflow.tracking import MlflowClient

    from raysim.security.report import resolve_run

    module, mark = _marking_module(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("x", str(tmp_path / "art")))
    cfg = tiny(algorithm={"name": "marking", "module": str(module)})
    client.log_dict(run.info.run_id, cfg, "config.yaml")
    with pytest.raises(ConfigError, match="--trust-modules"):
        resolve_run(run.info.run_id, uri)
    assert not mark.exists()
    cfg_back, run_id = resolve_run(run.info.run_id, uri, trust_modules=True)
    assert mark.exists() and run_id == run.info.run_id and cfg_back.algorithm.name == "marking"
