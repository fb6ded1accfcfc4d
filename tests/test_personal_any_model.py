"""Ditto, pFedMe and Local-only on a plain module: the personal state is a copy of the shared
parameters (``ModelHandle`` with several rest groups), trained, kept, evaluated, never uploaded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raysim.actors.local import local_core
from raysim.algorithms.fedoa.personal import PERSONAL_GROUPS
from raysim.config import load_config
from raysim.models.handle import ModelHandle
from raysim.models.layout import BUFFERS, SHARED
from raysim.training.loop import evaluate
from tests.conftest import ROOT, resumed_through_checkpoint

QUICKSTART = ROOT / "examples" / "quickstart.yaml"
PERSONAL_METHODS = ("ditto", "pfedme", "local_only")
MLP_NAMES = ["1.weight", "1.bias", "3.weight", "3.bias"]  # Flatten, Linear, ReLU, Linear


def config(algorithm: str, *overrides: str):
    """The quickstart (MLP on digits), shrunk: 6 clients, 4 a round, 2 rounds of 1 epoch."""
    return load_config(
        QUICKSTART,
        [
            f"algorithm={algorithm}",
            "rounds=2",
            "clients.num=6",
            "clients.per_round=4",
            "local.epochs=1",
            *overrides,
        ],
    )


def run(algorithm: str, *overrides: str, evaluate: bool = False):
    """One client at a time: the bit-for-bit identities between methods below hold there
    (batched execution agrees with it to float rounding, tests/test_batched.py)."""
    cfg = config(algorithm, "workers.execution=sequential", *overrides)
    core = local_core(cfg, evaluate=evaluate)
    while not core.done:
        core.step()
    return core


def flat_states(core) -> np.ndarray:
    states = core.materialized_states()
    return np.concatenate([states[j][k].ravel() for j in sorted(states) for k in sorted(states[j])])


# --------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("name", PERSONAL_METHODS)
def test_personal_copy_trains_and_never_reaches_the_global_vector(name):
    core = run(f"{{name: {name}}}")
    module = core.executor.runner.model.module
    # the global vector is the module's parameters, once: no personal tensor in it
    layout = core.server.layout
    assert layout.names == MLP_NAMES and layout.groups == [SHARED]
    assert layout.size == len(core.weights) == sum(p.numel() for p in module.parameters())
    shared = layout.unflatten(core.weights)
    initial = layout.unflatten(core.executor.runner.initial_global()[0])
    states = core.materialized_states()
    assert len(states) >= 4
    for j, state in states.items():
        assert sorted(state) == sorted(f"personal/{n}" for n in MLP_NAMES), j
        # the personal copy trained away from w^0 and is not the global model
        assert not np.array_equal(state["personal/1.weight"], initial["1.weight"]), j
        assert not np.allclose(state["personal/1.weight"], shared["1.weight"]), j
    metrics = core.history[-1]
    assert "client_personal_train_loss" in metrics or "client_param_distance" in metrics
    assert not any("feature_distance" in k for k in metrics)  # no hidden states on an MLP
    if name != "pfedme":  # personal phase first, then exactly FedAvg's client: same global
        np.testing.assert_array_equal(core.weights, run("{name: fedavg}").weights)


def test_ditto_at_zero_lambda_is_local_only_bit_for_bit():
    """Invariant I18 on a plain module: Ditto(λ=0)'s personal trajectory is Local-only's."""
    ref = run("{name: local_only}")
    zero = run("{name: ditto, lambda: 0.0}")
    np.testing.assert_array_equal(flat_states(zero), flat_states(ref))
    np.testing.assert_array_equal(zero.weights, ref.weights)
    assert not np.array_equal(flat_states(run("{name: ditto, lambda: 1.0}")), flat_states(ref))


def test_a_known_client_is_evaluated_with_its_personal_copy():
    core = run("{name: ditto}", "eval.every=1", evaluate=True)
    runner = core.executor.runner
    module, ds = runner.model.module, runner.dataset
    x, y = torch.tensor(ds.x_test), torch.tensor(ds.y_test, dtype=torch.long)
    states = core.materialized_states()

    def accuracy(values: dict[str, np.ndarray]) -> float:
        saved = {n: p.detach().clone() for n, p in module.named_parameters()}
        with torch.no_grad():
            for n, p in module.named_parameters():
                p.copy_(torch.from_numpy(values[n]))
            acc = evaluate(module, x, y)["accuracy"]
            for n, p in module.named_parameters():
                p.copy_(saved[n])
        return acc

    last = core.history[-1]
    global_acc = accuracy(core.server.layout.unflatten(core.weights))
    assert last["accuracy_global"] == global_acc
    rows = core.evaluator.last_clients
    assert sorted(r["client"] for r in rows) == sorted(states)
    for row in rows:
        assert row["evaluated_with"] == "personal"
        personal = {k.removeprefix("personal/"): v for k, v in states[row["client"]].items()}
        assert row["accuracy"] == accuracy(personal), row
    assert last["accuracy"] == pytest.approx(np.mean([r["accuracy"] for r in rows]))
    assert any(r["accuracy"] != global_acc for r in rows)


def test_batch_norm_statistics_stay_in_the_global_vector():
    cnn = "model={name: cnn, channels: [4], hidden: [16], batch_norm: true}"
    core = run("{name: ditto}", cnn)
    layout = core.server.layout
    assert layout.groups == [SHARED, BUFFERS]
    buffers = [t.name for t in layout.select(BUFFERS)]
    for state in core.materialized_states().values():
        keys = {k.removeprefix("personal/") for k in state}
        assert keys == {t.name for t in layout.select(SHARED)}
        assert not keys & set(buffers)


@pytest.mark.parametrize(
    "backend",
    [["local.backend=accelerate"], ["local.backend=deepspeed", "local.deepspeed.zero_stage=3"]],
    ids=["accelerate", "zero3"],
)
def test_other_backends_train_the_swapped_in_copy(backend):
    """The backends train whichever copy is in the module (ZeRO-3 partitions it and gathers it
    for Ditto's penalty), with torch's result."""
    pytest.importorskip(backend[0].split("=")[1])
    ref = run("{name: ditto}")
    core = run("{name: ditto}", *backend)
    np.testing.assert_allclose(flat_states(core), flat_states(ref), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(core.weights, ref.weights, rtol=1e-4, atol=1e-6)


def test_personal_copies_resume_bit_identically():
    cfg = config("{name: ditto}", "rounds=3")  # the default execution: Ditto batched
    full = local_core(cfg)
    while not full.done:
        full.step()
    resumed, _ = resumed_through_checkpoint(cfg, 1)
    assert resumed.digest() == full.digest()
    np.testing.assert_array_equal(flat_states(resumed), flat_states(full))


# --------------------------------------------------------------------------- the handle
class TiedNet(nn.Module):
    """Input and output layers share one weight; a BatchNorm in between."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 4)
        self.out.weight = self.inp.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.bn(self.inp(x))))


def has_grad(params) -> list[bool]:
    return [p.grad is not None for p in params]


def test_use_switches_between_the_module_and_its_personal_copy():
    torch.manual_seed(0)
    module = TiedNet()
    h = ModelHandle(module, PERSONAL_GROUPS)
    assert h.switches_groups and not ModelHandle.switches_groups and not h.has_hidden_states
    names = ["inp.weight", "inp.bias", "bn.weight", "bn.bias", "out.bias"]  # tied: listed once
    assert h.layout().shapes(SHARED) == [(n, tuple(p.shape)) for n, p in module.named_parameters()]
    assert [t.name for t in h.layout().select(SHARED)] == names
    assert sorted(h.get_state()) == sorted(f"personal/{n}" for n in names)  # no buffer
    # the copy starts at the built values (w^0) and is its own tensors
    w0 = h.get_adapter("personal")
    np.testing.assert_array_equal(w0, h.get_adapter("global"))
    glob, personal = h.adapter_parameters("global"), h.adapter_parameters("personal")
    assert not {id(p) for p in glob} & {id(p) for p in personal}

    h.set_adapter("personal", h.get_adapter("global") + 0.5)
    x = torch.randn(8, 4)
    module.eval()
    before = module(x).detach()
    h.use("personal")
    assert module.inp.weight is module.out.weight is personal[0]  # both tied sites swapped
    assert not torch.allclose(module(x), before)
    h.use("global")
    assert module.inp.weight is module.out.weight is glob[0]
    assert torch.equal(module(x), before)

    module.train()
    for group, other in (("personal", "global"), ("global", "personal")):
        h.use(group)
        module(x).square().sum().backward()
        assert all(has_grad(h.adapter_parameters(group))), group
        assert not any(has_grad(h.adapter_parameters(other))), group
        for p in glob + personal:
            p.grad = None
    h.use("global")

    # buffers are shared: a personal forward in train mode moves the global vector's statistics
    stats = h.get_global()[h.layout().mask(BUFFERS)]
    h.use("personal")
    module(x)
    h.use("global")
    assert not np.array_equal(h.get_global()[h.layout().mask(BUFFERS)], stats)

    # personal state round-trips and a first visit restores w^0
    state = h.get_state()
    h.set_state(None, seed=0)
    np.testing.assert_array_equal(h.get_adapter("personal"), w0)
    h.set_state(state, seed=0)
    np.testing.assert_array_equal(h.get_adapter("personal"), w0 + 0.5)
    with pytest.raises(ValueError, match="no parameter group"):
        h.use("other")


def test_one_rest_group_keeps_the_plain_handle():
    module = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    h = ModelHandle(module)
    assert not h.switches_groups
    params = list(module.parameters())
    h.use("global")
    assert list(module.parameters()) == params and h.global_parameters() == params
    assert h.get_state() == {}
