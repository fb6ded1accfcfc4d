"""FedOT's baselines (fedot.md §5) and their degenerate cases (invariant 14 of §8.2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.actors.jobs import client_seed
from raysim.actors.local import local_core
from raysim.training.loop import step_batches
from raysim.training.tasks import ClassificationTask

from .test_fedot import fedot_cfg


def scores(algorithm: dict, rounds: int = 2, **kw) -> tuple[np.ndarray, list[dict]]:
    """(final global weights, per-client evaluation rows) of a run on shifted digits."""
    core = local_core(fedot_cfg(n=4, rounds=rounds, algorithm=algorithm, **kw), evaluate=True)
    while not core.done:
        core.step()
    return core.weights, core.evaluator.last_clients


def per_client(rows: list[dict], key: str = "accuracy") -> np.ndarray:
    return np.array([r[key] for r in rows])


def test_i14_l_fedavg_without_fine_tuning_is_fedavg():
    w0, plain = scores({"name": "fedavg"})
    w1, tuned0 = scores({"name": "l_fedavg", "finetune_steps": 0})
    _, tuned = scores({"name": "l_fedavg", "finetune_steps": 30})
    assert np.array_equal(w0, w1)
    assert np.array_equal(per_client(plain), per_client(tuned0))
    assert np.array_equal(per_client(plain, "loss"), per_client(tuned0, "loss"))
    assert not np.array_equal(per_client(plain, "loss"), per_client(tuned, "loss"))


def test_i14_fedmi_at_alpha_0_is_fedavg_and_at_alpha_1_is_local_only():
    _, plain = scores({"name": "fedavg"})
    _, local = scores({"name": "local_only"})
    _, mi0 = scores({"name": "fedmi", "alpha": 0.0})
    _, mi1 = scores({"name": "fedmi", "alpha": 1.0})
    _, mid = scores({"name": "fedmi", "alpha": 0.5})
    assert np.array_equal(per_client(mi0), per_client(plain))
    assert np.array_equal(per_client(mi1), per_client(local))
    np.testing.assert_allclose(per_client(mi0, "loss"), per_client(plain, "loss"), rtol=1e-5)
    np.testing.assert_allclose(per_client(mi1, "loss"), per_client(local, "loss"), rtol=1e-5)
    assert not np.allclose(per_client(mid, "loss"), per_client(plain, "loss"))


def test_fedmi_param_space_mixes_the_two_copies():
    _, out = scores({"name": "fedmi", "alpha": 0.5, "space": "output"})
    _, par = scores({"name": "fedmi", "alpha": 0.5, "space": "param"})
    assert not np.array_equal(per_client(out, "loss"), per_client(par, "loss"))


def test_i14_fed_fomaml_with_alpha_0_is_sgd_at_beta_on_the_second_batches():
    """α = 0: w̃ = w, so each local step is w ← w − β∇f(w; D') with D' every second batch of
    the client's stream: FedAvg at lr β on that stream (one client, one round, by hand)."""
    from raysim.runtime import data_spec, method_resident, run_dataset

    beta = 0.07
    cfg = fedot_cfg(
        n=1, m=60, rounds=1, algorithm={"name": "fed_fomaml", "alpha": 0.0, "beta": beta}
    )
    core = local_core(cfg)
    core.step()
    ds = run_dataset(cfg)
    model = method_resident(cfg, data_spec(ds)).module
    x, y = (torch.from_numpy(a) for a in ds.client_data(0))
    doubled = cfg.local.model_copy(update={"max_steps": 4, "epochs": 2})
    stream = list(
        step_batches(60, doubled, torch.Generator().manual_seed(client_seed(cfg.seed, 0, 0)))
    )
    params = list(model.parameters())
    task = ClassificationTask()
    for idx in stream[1::2]:
        grads = torch.autograd.grad(task.loss(model, (x[idx], y[idx])), params)
        with torch.no_grad():
            for q, g in zip(params, grads, strict=True):
                q.add_(g, alpha=-beta)
    expected = torch.cat([q.detach().reshape(-1) for q in params]).numpy()
    # the server adds the delta to the base: equal up to that rounding
    np.testing.assert_allclose(core.weights, expected, atol=1e-7)


def test_fed_fomaml_adapts_with_one_step_before_testing():
    _, none = scores({"name": "fed_fomaml", "eval_steps": 0})
    _, one = scores({"name": "fed_fomaml", "eval_steps": 1})
    assert not np.array_equal(per_client(none, "loss"), per_client(one, "loss"))


@pytest.mark.parametrize("name", ["l_fedavg", "fedmi", "fed_fomaml", "local_only", "fedot"])
def test_every_fedot_comparison_runs_on_colour_shifts(name):
    algo = {"name": name}
    if name == "fedot":
        algo |= {"psi_family": "pixel_relu", "potential": "nn", "lr_map": 0.01}
    core = local_core(fedot_cfg(n=3, rounds=1, algorithm=algo, shift="colour"), evaluate=True)
    m = core.step()
    assert 0 <= m["accuracy"] <= 1 and m["clients_evaluated"] == 3
