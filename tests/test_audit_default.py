"""The leak auditor's default (``audit.leaks: auto``, ``raysim/security/policy.py``): on wherever
the
run's method or a ``hooks.server`` mixer declares server-private values, off elsewhere; turned off
over declared values, the run warns in one line, tags its MLflow run and its plan says so.

Each run is a whole ``raysim.run`` without Ray (``runtime: local``); the one whose MLflow run is
read writes to a real store (its writer's process takes most of the few seconds)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.numpy import save_file

import raysim
from raysim.config import load_config
from raysim.errors import LeakError
from raysim.launch.plan import plan_run
from raysim.models import DataSpec, build_handle
from raysim.security.policy import AUDIT_TAG, audit_tags, audits_leaks
from tests.conftest import tiny

OFF_WARNING = "audit.leaks=false: the leak auditor is off"


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def foundation(tmp_path_factory) -> str:
    """Other random weights of the tiny run's MLP, saved under its layout's names."""
    torch.manual_seed(123)
    handle = build_handle(load_config(tiny()).model, DataSpec("dense", (64,), 10))
    path = tmp_path_factory.mktemp("foundation") / "pre.safetensors"
    save_file({k: v.detach().numpy().copy() for k, v in handle.module.state_dict().items()}, path)
    return str(path)


def config(algorithm: dict, *overrides: str, uri: str | None = None):
    """A two-round tiny run without Ray, without an ``audit`` section unless overridden; tracked
    into ``uri`` (else untracked)."""
    raw = tiny(algorithm=algorithm, rounds=2, workers={"count": 1}, runtime="local")
    raw["tracking"] = {"uri": uri, "experiment": "audit-default"} if uri else {"enabled": False}
    return load_config(raw, list(overrides))


def warned(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if OFF_WARNING in r.getMessage()]


def run(cfg, caplog):
    """The finished run and the off-warnings it logged."""
    with caplog.at_level(logging.WARNING, logger="raysim"):
        res = raysim.run(cfg)
    return res, warned(caplog)


def test_a_fedbaf_run_without_an_audit_section_runs_under_the_auditor(foundation, caplog):
    cfg = config({"name": "fedbaf", "foundation": foundation})
    assert cfg.audit.leaks == "auto" and audits_leaks(cfg)
    res, said = run(cfg, caplog)
    assert all(h["audit_wall_s"] > 0 for h in res.history)  # every round checked its broadcast
    assert audit_tags(cfg) == {AUDIT_TAG: "on"} and not said
    assert "leak auditor: on (fedbaf declares server-private values)" in res.plan.splitlines()
    # the positive control: weight-init sends the foundation in round 0, and the default stops it
    weight_init = {"name": "fedbaf", "foundation": foundation, "variant": "weight_init"}
    with pytest.raises(LeakError, match="server-private"):
        raysim.run(config(weight_init, "rounds=1"))


def test_a_mixer_that_declares_secrets_turns_the_auditor_on_over_any_method(foundation):
    cfg = config({"name": "fedavg"})
    hooked = load_config(cfg, [f"hooks.server=[{{name: fedbaf, foundation: {foundation}}}]"])
    assert not audits_leaks(cfg) and audits_leaks(hooked)


def test_turning_it_off_over_declared_secrets_warns_tags_and_plans_off(uri, foundation, caplog):
    cfg = config({"name": "fedbaf", "foundation": foundation}, "audit.leaks=false", uri=uri)
    plan = plan_run(cfg).describe()
    assert plan.splitlines()[-1] == (
        "leak auditor: off (audit.leaks=false; fedbaf declares server-private values)"
    )
    res, said = run(cfg, caplog)
    tags = MlflowClient(uri).get_run(res.run_id).data.tags
    assert len(said) == 1 and "fedbaf declares server-private values" in said[0], said
    assert "\n" not in said[0]
    assert tags[AUDIT_TAG] == "off"
    assert not any("audit_wall_s" in h for h in res.history)
    assert res.plan == plan


def test_a_method_without_secrets_leaves_the_auditor_off_and_says_nothing(caplog):
    cfg = config({"name": "fedavg"})
    res, said = run(cfg, caplog)
    assert not said and not audits_leaks(cfg) and audit_tags(cfg) == {AUDIT_TAG: "off"}
    assert not any("audit_wall_s" in h for h in res.history)
    assert "leak auditor: off (no server-private values declared)" in res.plan.splitlines()
    _, said = run(load_config(cfg, ["audit.leaks=false"]), caplog)
    assert not said  # off over nothing declared: nothing to warn of


def test_a_method_declares_secrets_by_overriding_them_and_its_spec_must_agree():
    from raysim.algorithms.base import Method, Strategy
    from raysim.algorithms.general.fedavg import FedAvg
    from raysim.algorithms.registry import MIXERS, get_method, method_spec
    from raysim.algorithms.spec import MethodSpec

    class Private(FedAvg):
        def secrets(self):
            return []

    assert method_spec("fedbaf").secrets and get_method("fedbaf").spec.secrets
    assert MIXERS.spec("fedbaf").secrets and not MIXERS.spec("damp").secrets
    assert Method("p", Private).spec.secrets and not Method("q", FedAvg).spec.secrets
    with pytest.raises(ValueError, match="secrets=False, its strategy Private overrides"):
        Method.of(MethodSpec("p", "m"), Private)
    with pytest.raises(ValueError, match="secrets=True, its strategy Strategy does not"):
        Method.of(MethodSpec("p", "m", secrets=True), Strategy)


def test_a_mixer_composed_on_a_method_keeps_the_method_s_secrets():
    """``hooks.server`` over a method with secrets: the auditor still sees the method's."""
    from raysim.algorithms.base import Secret
    from raysim.algorithms.general.fedavg import FedAvg
    from raysim.algorithms.hooks import ComposedStrategy
    from raysim.algorithms.registry import MIXERS

    block = Secret("private.block", np.arange(4), np.ones(4, np.float32))

    class Private(FedAvg):
        def secrets(self):
            return [block]

    mixed = ComposedStrategy(Private(None, np.zeros(8, np.float32), 2), [
        MIXERS.get("damp").build({"mu": 0.5})])  # fmt: skip
    assert [s.name for s in mixed.secrets()] == ["private.block"]
