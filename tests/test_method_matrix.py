"""Every registered method on every example config: it runs, or it is refused before Ray starts in
one line that says what to set (issue: "methods that check what they need")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raysim.actors.local import local_core
from raysim.algorithms.registry import get_method, method_names
from raysim.config import ConfigError, load_config
from tests.conftest import ROOT

QUICKSTART = ROOT / "examples" / "quickstart.yaml"
#: every run config under examples/ (methods.yaml is Feddle's method table, not a run)
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if p.name != "methods.yaml")


def outcome(config, name: str) -> str:
    """ "" when the config with method ``name`` validates, else the one-line refusal."""
    try:
        load_config(config, [f"algorithm={{name: {name}}}", "rounds=1"])
    except ConfigError as e:
        return str(e)
    return ""


def test_every_method_declares_what_it_needs_and_lists_it():
    for name in method_names():
        assert get_method(name).needs.describe()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_every_method_on_every_example_validates_or_is_refused_in_one_line(example):
    for name in method_names():
        message = outcome(example, name)
        assert "\n" not in message, (name, message)
        assert "Traceback" not in message


def test_refusals_name_what_to_set():
    assert outcome(QUICKSTART, "feddle") == (
        "invalid config: feddle needs in-distribution server data: set data.server.id_size "
        "(examples/feddle/mini.yaml shows how)"
    )
    assert "set data.server.ood" in outcome(QUICKSTART, "feddle_ood")
    fedoa = outcome(QUICKSTART, "fedoa")
    assert "fedoa needs a model with traits [causal_lm lora]" in fedoa
    assert "model 'mlp' has classifier" in fedoa and "examples/fedoa/mini.yaml" in fedoa
    # what the method needs is there: the same method validates
    assert outcome(ROOT / "examples" / "feddle" / "mini.yaml", "feddle_ood") == ""
    assert outcome(ROOT / "examples" / "fedoa" / "mini.yaml", "fedoa") == ""


@pytest.mark.matrix  # suite time: every method's round; each method's own tests run fast
def test_every_method_the_quickstart_accepts_runs_a_round():
    """``raysim run examples/quickstart.yaml algorithm.name=NAME rounds=1``, in process: each
    method either is refused (above) or trains, aggregates and evaluates one round."""
    ran, refused = [], []
    for name in method_names():
        if outcome(QUICKSTART, name):
            refused.append(name)
            continue
        cfg = load_config(QUICKSTART, [f"algorithm.name={name}", "rounds=1", "eval.every=1"])
        core = local_core(cfg, evaluate=True)
        while not core.done:
            core.step()
        assert 0.0 <= core.history[-1]["accuracy"] <= 1.0, name
        ran.append(name)
    # the classic methods and the personalisation methods that run on any model all run
    assert {"fedavg", "fedprox", "fedadam", "fedbuff", "ditto", "pfedme", "local_only"} <= set(ran)
    assert {"l_fedavg", "fedmi"} <= set(ran)
    assert {"feddle", "feddle_ood", "center", "fedoa", "fedlora", "fedbaf"} <= set(refused)
    assert {"fedot", "fed_fomaml"} <= set(refused)  # the quickstart's SGD has momentum


def test_a_refused_method_exits_2_in_one_line_before_ray_starts(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    res = subprocess.run(
        [sys.executable, "-m", "raysim.cli", "run", str(QUICKSTART), "algorithm.name=feddle"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0, res.stderr
    assert "set data.server.id_size" in res.stderr
    assert not (tmp_path / "mlflow.db").exists()
