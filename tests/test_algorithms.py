"""Server and client rules of the spine's methods (Feddle spec §4; Reddi et al.; Li et al.)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.actors.coordinator_core import CoordinatorCore
from raysim.actors.executor import InProcessExecutor
from raysim.actors.worker import ClientRunner
from raysim.algorithms import get_method, method_names
from raysim.algorithms.base import Update
from raysim.config import load_config
from raysim.data import build_federated_dataset
from raysim.sim.build import initial_weights


def update(client, delta, base, n=10, tau_v=0, k=0, r=0, t=None) -> Update:
    delta = np.asarray(delta, dtype=np.float32)
    return Update(
        client,
        delta,
        n,
        k,
        0,
        float(r if t is None else t),
        r,
        tau_v,
        np.asarray(base, dtype=np.float32),
    )


def strategy(name, w0, **params):
    return get_method(name).build_strategy(params, np.asarray(w0, dtype=np.float32), 10)


def test_registry_lists_the_spine_methods():
    assert {"fedavg", "fedprox", "fedadam", "fedyogi", "fedasync", "fedbuff"} <= set(method_names())
    with pytest.raises(KeyError, match="did you mean 'fedavg'"):
        get_method("fedavgg")


def test_fedavg_weights_by_sample_count_and_keeps_model_without_arrivals():
    s = strategy("fedavg", [0.0, 0.0])
    s.on_arrival(update(0, [1.0, 0.0], [0, 0], n=30))
    s.on_arrival(update(1, [0.0, 1.0], [0, 0], n=10))
    assert s.on_round_end(0)
    np.testing.assert_allclose(s.weights, [0.75, 0.25])
    before = s.weights.copy()
    s.on_round_end(1)
    np.testing.assert_array_equal(s.weights, before)


def test_fedasync_constant_mixing_one_replaces_model_by_latest_arrival():
    """I-14: α = 1 without staleness decay ⇒ the global model is the arriving local model."""
    s = strategy("fedasync", [5.0, 5.0], staleness="constant", mixing=1.0)
    rng = np.random.default_rng(0)
    for i in range(6):
        base = rng.normal(size=2).astype(np.float32)
        u = update(i, rng.normal(size=2), base, tau_v=int(rng.integers(0, 9)))
        assert s.on_arrival(u)
        np.testing.assert_array_equal(s.weights, u.local_weights)


@pytest.mark.parametrize(
    "kind, a, b, tau, expect",
    [
        ("polynomial", 0.5, 0, 3, 0.5 * 4**-0.5),
        ("hinge", 0.5, 4, 2, 0.5),
        ("hinge", 0.5, 4, 8, 0.5 / (0.5 * 4 + 1)),
        ("constant", 0.5, 0, 50, 0.5),
    ],
)
def test_fedasync_staleness_functions(kind, a, b, tau, expect):
    """I-14: ω ← (1−α_t)ω + α_t(ω^{k_j}+Δ_j), α_t = α·s(τ)."""
    w, base, delta = np.array([1.0, 2.0]), np.array([0.0, 1.0]), np.array([0.5, -1.0])
    s = strategy("fedasync", w, staleness=kind, a=a, b=b, mixing=0.5)
    s.on_arrival(update(0, delta, base, tau_v=tau))
    np.testing.assert_allclose(s.weights, (1 - expect) * w + expect * (base + delta), rtol=1e-6)
    d = strategy("fedasync", w, staleness=kind, a=a, b=b, mixing=0.5, form="delta")
    d.on_arrival(update(0, delta, base, tau_v=tau))
    np.testing.assert_allclose(d.weights, w + expect * delta, rtol=1e-6)


def test_fedbuff_flushes_every_k_and_weights_staleness():
    s = strategy("fedbuff", [0.0], buffer_size=3, server_lr=0.5)
    changed = [s.on_arrival(update(i, [float(i + 1)], [0.0])) for i in range(7)]
    assert changed == [False, False, True, False, False, True, False]
    np.testing.assert_allclose(s.weights, [0.5 * (6 / 3) + 0.5 * (15 / 3)])
    assert not s.on_round_end(0) and len(s.buffer) == 1
    w = strategy("fedbuff", [0.0], buffer_size=2, staleness_weight="inv_sqrt")
    w.on_arrival(update(0, [1.0], [0.0], tau_v=3))
    w.on_arrival(update(1, [1.0], [0.0], tau_v=0))
    np.testing.assert_allclose(w.weights, [(0.5 + 1.0) / 2], rtol=1e-6)
    pr = strategy("fedbuff", [0.0], buffer_size=99, per_round=True)
    pr.on_arrival(update(0, [2.0], [0.0]))
    assert pr.on_round_end(0)
    np.testing.assert_allclose(pr.weights, [2.0])


@pytest.mark.parametrize("name", ["fedadam", "fedyogi"])
def test_server_optimisers_follow_reddi(name):
    eta, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    s = strategy(name, [0.0, 0.0], server_lr=eta, beta1=b1, beta2=b2, tau=tau)
    m, v, w = np.zeros(2), np.full(2, tau**2), np.zeros(2)
    for delta in ([1.0, -2.0], [0.5, 0.5]):
        s.on_arrival(update(0, delta, [0, 0]))
        s.on_round_end(0)
        d = np.array(delta)
        m = b1 * m + (1 - b1) * d
        v = (
            b2 * v + (1 - b2) * d**2
            if name == "fedadam"
            else v - (1 - b2) * d**2 * np.sign(v - d**2)
        )
        w = w + eta * m / (np.sqrt(v) + tau)
        np.testing.assert_allclose(s.weights, w, rtol=1e-5)


def _core(overrides):
    cfg = load_config(
        {
            "seed": 1,
            "rounds": 4,
            "clients": {"num": 20, "per_round": 5},
            "data": {"name": "mnist1d", "partition": {"kind": "iid"}},
            "model": {"name": "mlp", "hidden": [32]},
            "local": {"epochs": 1, "batch_size": 32, "lr": 0.05},
        },
        overrides,
    )
    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    runner = ClientRunner(cfg, ds)
    core = CoordinatorCore(
        cfg, initial_weights(cfg, ds), ds.client_sizes(), InProcessExecutor(runner)
    )
    return core, ds


def test_fedbuff_with_k_equal_s_and_no_delay_equals_fedavg_exactly():
    """I-4 / issue 2: σ=0, equal client sizes, K = S, η = 1 ⇒ identical global models."""
    avg, ds = _core(["algorithm.name=fedavg"])
    assert len(set(ds.client_sizes().tolist())) == 1  # equal sizes: the theorem's premise
    buff, _ = _core(["algorithm.name=fedbuff", "algorithm.buffer_size=5", "algorithm.server_lr=1"])
    while not avg.done:
        avg.step()
        buff.step()
        np.testing.assert_array_equal(avg.weights, buff.weights)
    assert avg.digest() == buff.digest()
    other, _ = _core(["algorithm.name=fedbuff", "algorithm.buffer_size=2"])
    while not other.done:
        other.step()
    assert not np.array_equal(avg.weights, other.weights)  # the equality above is not vacuous


def test_schedule_is_method_independent():
    """I-13: every method sees the same dispatches and deliveries for a fixed seed."""
    logs = []
    for name in ("fedavg", "fedasync", "fedbuff"):
        core, _ = _core(
            [f"algorithm.name={name}", "delays.kind=half_normal", "delays.sigma=2", "rounds=6"]
        )
        while not core.done:
            core.step()
        logs.append([(r["clients_arrived"], r["clients_in_flight"]) for r in core.history])
        logs[-1].append(sorted((c, s.dispatched, s.arrived) for c, s in core.stats.items()))
    assert logs[0] == logs[1] == logs[2]


def test_fedprox_mu_zero_matches_fedavg_and_large_mu_stays_close():
    base, _ = _core(["algorithm.name=fedavg", "rounds=2"])
    prox0, _ = _core(["algorithm.name=fedprox", "algorithm.mu=0", "rounds=2"])
    prox, _ = _core(["algorithm.name=fedprox", "algorithm.mu=10", "rounds=2"])
    w0 = base.weights.copy()
    for c in (base, prox0, prox):
        while not c.done:
            c.step()
    np.testing.assert_array_equal(base.weights, prox0.weights)
    assert np.linalg.norm(prox.weights - w0) < 0.7 * np.linalg.norm(base.weights - w0)


def test_fedprox_penalty_value():
    client = get_method("fedprox").build_client({"mu": 2.0})
    g = [torch.zeros(3)]
    pen = client.penalty(g)
    assert float(pen([torch.tensor([1.0, 2.0, 0.0])])) == pytest.approx(0.5 * 2.0 * 5.0)
