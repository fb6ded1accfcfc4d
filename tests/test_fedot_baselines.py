"""FedOT's baselines (FedOT spec §5) and their degenerate cases (invariant 14 of §8.2)."""

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


def client_context(cfg, client: int = 0):
    """A trained run's client ``client``, loaded as its evaluation would load it: (runner,
    context, global weights, the client's state)."""
    from raysim.actors.jobs import ClientJob
    from raysim.actors.worker import ClientRunner
    from raysim.sim.build import run_dataset

    core = local_core(cfg)
    while not core.done:
        core.step()
    runner = ClientRunner(cfg, run_dataset(cfg))
    state = core.materialized_states().get(client)
    job = ClientJob(-1, client, cfg.rounds, cfg.seed, state=state)
    ctx, _ = runner._context(core.weights, job)
    return runner, ctx, core.weights


@pytest.mark.parametrize("alpha", [0.5, 0.25])
def test_fedmi_mixes_as_its_space_says(alpha):
    """Issue 45: this only checked that the two spaces differ. ``param``: the evaluated copy is
    α·local + (1−α)·w, tensor by tensor; ``output``: the answer is
    log(α·softmax(f_local) + (1−α)·softmax(f_w)), against two separate copies by hand."""
    from raysim.algorithms.fedot.baselines import GLOBAL, PERSONAL

    for space in ("param", "output"):
        cfg = fedot_cfg(n=2, rounds=2, algorithm={"name": "fedmi", "alpha": alpha, "space": space})
        runner, ctx, _ = client_context(cfg)
        h, algo = ctx.model, runner.client_algorithm
        local, shared = h.get_group(PERSONAL).copy(), h.get_group(GLOBAL).copy()
        assert np.abs(local - shared).max() > 1e-3  # two copies that differ
        x = torch.from_numpy(np.asarray(ctx.data[0][:7]))
        with torch.no_grad():
            h.use(PERSONAL)
            p_local = torch.softmax(h.module(x), -1)
            h.use(GLOBAL)
            p_shared = torch.softmax(h.module(x), -1)
        module = algo.adapt(ctx)
        if space == "param":
            assert module is None
            np.testing.assert_allclose(
                h.get_group(PERSONAL), alpha * local + (1 - alpha) * shared, rtol=1e-6, atol=1e-7
            )
        else:
            with torch.no_grad():
                got = module(x)
            want = torch.log(alpha * p_local + (1 - alpha) * p_shared)
            torch.testing.assert_close(got, want)


def test_i14_fed_fomaml_with_alpha_0_is_sgd_at_beta_on_the_second_batches():
    """α = 0: w̃ = w, so each local step is w ← w − β∇f(w; D') with D' every second batch of
    the client's stream: FedAvg at lr β on that stream (one client, one round, by hand)."""
    from raysim.sim.build import data_spec, method_resident, run_dataset

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


def test_fed_fomaml_adapts_with_one_step_at_alpha_before_testing():
    """Issue 45: this only checked that one step changes the loss. The adapted model is
    w − α∇f(w; B) on one batch B of the client's adaptation stream, by hand; zero steps leave
    w as it is."""
    alpha = 0.03
    cfg = fedot_cfg(n=2, rounds=1, algorithm={"name": "fed_fomaml", "alpha": alpha})
    runner, ctx, w = client_context(cfg)
    h = ctx.model
    params = h.global_parameters()
    batch = next(iter(step_batches(
        len(ctx.data[1]), ctx.config.model_copy(update={"max_steps": 1, "epochs": 1}),
        ctx.phase("adapt"),
    )))  # fmt: skip
    task = ClassificationTask()
    x, y = (torch.as_tensor(np.asarray(a)[batch]) for a in ctx.data)
    grads = torch.autograd.grad(task.loss(h.module, (x, y)), params)
    want = [(q - alpha * g).detach().numpy().copy() for q, g in zip(params, grads, strict=True)]
    runner.client_algorithm.adapt(ctx)
    for q, expected in zip(params, want, strict=True):
        np.testing.assert_allclose(q.detach().numpy(), expected, rtol=1e-6, atol=1e-7)
    assert max(np.abs(g.numpy()).max() for g in grads) * alpha > 1e-5  # it moved
    cfg0 = fedot_cfg(n=2, rounds=1, algorithm={"name": "fed_fomaml", "eval_steps": 0})
    runner0, ctx0, w0 = client_context(cfg0)
    runner0.client_algorithm.adapt(ctx0)
    np.testing.assert_array_equal(ctx0.model.get_global(), w0)


@pytest.mark.parametrize("name", ["l_fedavg", "fedmi", "fed_fomaml", "local_only", "fedot"])
def test_every_fedot_comparison_runs_on_colour_shifts(name):
    """Each comparison takes (N, P, 3) colour inputs and evaluates every client (a method that
    cannot fails here); what a client is scored on is the next test's."""
    algo = {"name": name}
    if name == "fedot":
        algo |= {"psi_family": "pixel_relu", "potential": "nn", "lr_map": 0.01}
    core = local_core(fedot_cfg(n=3, rounds=1, algorithm=algo, shift="colour"), evaluate=True)
    m = core.step()
    assert 0 <= m["accuracy"] <= 1 and m["clients_evaluated"] == 3


def colour_view(shifts, client: int) -> np.ndarray:
    """Client ``client``'s Colored-MNIST view of the test images, from §6.2's formula: a_j
    where x ≤ ζ (background), x · b_j elsewhere."""
    x = shifts.x_test_raw.reshape(len(shifts.x_test_raw), -1).astype(np.float64)
    p = shifts.params(client, x.shape[1])
    background = (x <= shifts.cfg.threshold)[..., None]
    return np.where(background, p["a"], x[..., None] * p["b"]).astype(np.float32)


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "fedavg"},
        {"name": "fedot", "psi_family": "pixel_relu", "potential": "nn", "lr_map": 0.01},
    ],
    ids=["global model", "fedot's own map"],
)
def test_on_colour_shifts_each_client_is_scored_on_its_own_colour_view(algorithm):
    """The loss each client reports is its model's on its own colour view of the test images,
    recomputed here from the formula; a neighbour's view gives another loss."""
    cfg = fedot_cfg(
        n=3, rounds=3, algorithm=algorithm, shift="colour", local={"lr": 0.2, "max_steps": 4}
    )
    core = local_core(cfg, evaluate=True)
    while not core.done:
        core.step()
    reported = {r["client"]: r["loss"] for r in core.evaluator.last_clients}
    assert sorted(reported) == [0, 1, 2]
    for j in range(3):
        runner, ctx, _ = client_context(cfg, j)  # the client's model as its evaluation loads it
        shifts = runner.dataset.shifts
        y = torch.tensor(runner.dataset.eval_sets["test"].y, dtype=torch.long)
        module = ctx.model.module.eval()

        def loss_on(view: np.ndarray, module=module, y=y) -> float:
            with torch.no_grad():
                return float(torch.nn.functional.cross_entropy(module(torch.from_numpy(view)), y))

        assert loss_on(colour_view(shifts, j)) == pytest.approx(reported[j], rel=1e-5)
        assert loss_on(colour_view(shifts, (j + 1) % 3)) != pytest.approx(reported[j], rel=1e-4)
