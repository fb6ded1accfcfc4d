"""Feddle's server-side baselines (Feddle spec §4) and its §7.2 invariants I-4, I-5, I-13, I-14."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raysim.actors.local import local_core
from raysim.algorithms.base import Update
from raysim.algorithms.general.ca2fl import CA2FL, CA2FLParams
from raysim.algorithms.general.fedasync import FedAsync, FedAsyncParams
from raysim.algorithms.general.fedbuff import FedBuff, FedBuffParams
from raysim.algorithms.registry import get_method
from raysim.config import load_config

DIGITS = {"name": "digits", "partition": {"kind": "dirichlet", "alpha": 0.3}}


def cfg_for(algorithm, rounds=4, id_size=0, ood=(), **extra):
    """A small digits run; ``ood``: the server's out-of-domain pools (``data.server.ood``)."""
    server = {"id_size": id_size} | ({"ood": list(ood)} if ood else {})
    raw = {
        "seed": 2,
        "rounds": rounds,
        "clients": {"num": 20, "per_round": 5},
        "data": {**DIGITS, "server": server},
        "model": {"name": "mlp", "hidden": [16]},
        "local": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "algorithm": algorithm,
        **extra,
    }
    return load_config(raw)


def run(cfg, hook=None):
    core = local_core(cfg)
    while not core.done:
        core.step()
        if hook:
            hook(core)
    return core


def upd(client, delta, k=0, n=10, version=0, tau=0, base=None):
    delta = np.asarray(delta, dtype=np.float32)
    base = np.zeros_like(delta) if base is None else np.asarray(base, dtype=np.float32)
    return Update(client, delta, n, k, version, k + 0.5, k + tau, tau, base)


# --------------------------------------------------------------------------- I-4
def test_fedbuff_per_round_equals_fedavg_with_equal_sizes_for_any_sigma():
    """I-4 second half: fedbuff_per_round ≡ FedAvg when client sizes are equal, any σ."""
    iid = {"name": "mnist1d", "partition": {"kind": "iid"}}
    delays = {"kind": "half_normal", "sigma": 3.0}
    kw = dict(rounds=6, delays=delays)
    a = cfg_for({"name": "fedavg"}, **kw).model_dump(mode="json")
    b = cfg_for({"name": "fedbuff_per_round"}, **kw).model_dump(mode="json")
    a["data"] = b["data"] = {**iid}
    avg, per_round = run(load_config(a)), run(load_config(b))
    assert len(set(avg.executor.runner.dataset.client_sizes().tolist())) == 1
    assert sum(h["clients_arrived"] for h in avg.history) > 0
    np.testing.assert_allclose(avg.weights, per_round.weights, rtol=1e-5, atol=1e-6)
    # not vacuous: with unequal sizes they differ
    uneq_a = run(cfg_for({"name": "fedavg"}, **kw))
    uneq_b = run(cfg_for({"name": "fedbuff_per_round"}, **kw))
    assert not np.allclose(uneq_a.weights, uneq_b.weights)


def test_fedbuff_per_round_is_registered_with_its_rule():
    m = get_method("fedbuff_per_round")
    assert m.params().per_round and m.strategy is FedBuff


# --------------------------------------------------------------------------- I-5 CA2FL
def test_ca2fl_first_flush_equals_fedbuff():
    """I-5(a): the first CA2FL flush (all caches 0) equals FedBuff's."""
    w0 = np.zeros(4, dtype=np.float32)
    ca = CA2FL(CA2FLParams(buffer_size=2, server_lr=1.0), w0, 5)
    fb = FedBuff(FedBuffParams(buffer_size=2, server_lr=1.0), w0, 5)
    ups = [upd(1, [1, 2, 3, 4]), upd(3, [0.5, -1, 0, 2])]
    for u in ups:
        assert ca.on_arrival(u) == fb.on_arrival(u)
    np.testing.assert_array_equal(ca.weights, fb.weights)


def test_ca2fl_equals_fedbuff_when_every_client_is_in_every_buffer():
    """I-5(b): J = S = K_buf, σ = 0 ⇒ CA2FL ≡ FedBuff every round (float tolerance)."""
    rng = np.random.default_rng(0)
    w0 = np.zeros(6, dtype=np.float32)
    ca = CA2FL(CA2FLParams(buffer_size=3, server_lr=0.7), w0, 3)
    fb = FedBuff(FedBuffParams(buffer_size=3, server_lr=0.7), w0, 3)
    for k in range(5):
        for c in range(3):
            u = upd(c, rng.normal(size=6), k=k)
            ca.on_arrival(u)
            fb.on_arrival(u)
        np.testing.assert_allclose(ca.weights, fb.weights, rtol=1e-5, atol=1e-6)


def test_ca2fl_calibrates_with_the_cache():
    """A hand-computed second flush: v = h̄ + mean(Δ − h_i)."""
    w0 = np.zeros(2, dtype=np.float32)
    ca = CA2FL(CA2FLParams(buffer_size=1, server_lr=1.0), w0, 4)
    ca.on_arrival(upd(0, [4.0, 0.0]))  # v = 0 + 4 ; h_0 = 4 ; h̄ = 1
    ca.on_arrival(upd(0, [2.0, 2.0]))  # v = h̄ + (Δ − h_0) = (1, 0) + (−2, 2) = (−1, 2)
    np.testing.assert_allclose(ca.weights, [4.0 - 1.0, 2.0])
    assert ca.metrics()["ca2fl_cache_bytes"] == 8


# --------------------------------------------------------------------------- I-14 FedAsync
def test_fedasync_with_alpha_one_and_no_staleness_takes_the_local_model():
    """I-14: a = 0, α = 1, τ = 0 ⇒ the global model is the client's local model."""
    p = FedAsyncParams(mixing=1.0, a=0.0)
    s = FedAsync(p, np.zeros(3, dtype=np.float32), 1)
    base = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    s.weights = base.copy()
    s.on_arrival(upd(0, [0.5, 0.5, -1], base=base))
    np.testing.assert_array_equal(s.weights, base + np.array([0.5, 0.5, -1], dtype=np.float32))


@pytest.mark.parametrize("form", ["model_mixing", "delta"])
def test_fedasync_stale_update_follows_its_form(form):
    """I-14: model mixing with a stale update gives (1−α_t)ω + α_t(ω^{k_j}+Δ_j),
    α_t = α(τ+1)^{−a} (and the delta form ω + α_t Δ_j)."""
    p = FedAsyncParams(mixing=0.6, a=0.5, form=form)
    w = np.array([1.0, -1.0], dtype=np.float32)
    old = np.array([0.0, 0.0], dtype=np.float32)
    s = FedAsync(p, w, 2)
    delta = np.array([2.0, 4.0], dtype=np.float32)
    s.on_arrival(upd(0, delta, tau=3, base=old))
    alpha = 0.6 * (3 + 1) ** -0.5
    want = (1 - alpha) * w + alpha * (old + delta) if form == "model_mixing" else w + alpha * delta
    np.testing.assert_allclose(s.weights, want, rtol=1e-6)


@pytest.mark.parametrize("unit, tau", [("versions", 10), ("rounds", 1)])
def test_fedasync_counts_staleness_in_its_unit(unit, tau):
    """Feddle spec §4.3 counts τ in versions (one per arrival, about S a round); ``staleness_unit:
    rounds`` counts rounds, as Xie et al. count epochs: an update 1 round and 10 versions old."""
    p = FedAsyncParams(mixing=0.6, a=0.5, form="delta", staleness_unit=unit)
    s = FedAsync(p, np.zeros(2, dtype=np.float32), 2)
    zero = np.zeros(2, dtype=np.float32)
    s.on_arrival(Update(0, np.ones(2, dtype=np.float32), 10, 0, 0, 0.5, 1, 10, zero))
    np.testing.assert_allclose(s.weights, 0.6 * (tau + 1) ** -0.5, rtol=1e-6)
    assert s.metrics()["fedasync_alpha"] == pytest.approx(0.6 * (tau + 1) ** -0.5)


# --------------------------------------------------------------------------- server training
def test_center_touches_no_client_and_trains_on_the_server_set():
    """I-13: the Center run touches no clients (nothing dispatched, sent or received)."""
    core = run(cfg_for({"name": "center", "server_epochs": 5}, rounds=2, id_size=40))
    assert sum(s.dispatched for s in core.stats.values()) == 0
    assert all(h["bytes_down"] == 0 and h["clients_arrived"] == 0 for h in core.history)
    assert core.history[0]["model_version"] == 1
    w0 = local_core(cfg_for({"name": "center"}, id_size=40)).weights
    assert not np.array_equal(core.weights, w0)
    with pytest.raises(ValueError, match="data.server.id_size"):
        run(cfg_for({"name": "center"}, rounds=1))


def test_fedft_is_fedavg_then_server_fine_tuning():
    """With server_epochs=0 Fed+FT is FedAvg exactly; with epochs it moves further."""
    avg = run(cfg_for({"name": "fedavg"}))
    ft0 = run(cfg_for({"name": "fedft", "server_epochs": 0}, id_size=40))
    np.testing.assert_array_equal(avg.weights, ft0.weights)
    ft = run(cfg_for({"name": "fedft", "server_epochs": 2}, id_size=40))
    assert not np.array_equal(avg.weights, ft.weights)
    assert np.isfinite(ft.history[-1]["server_train_loss"])


def test_hfcl_with_no_arrival_takes_the_server_delta_whole():
    """ω + (n_srv/n_srv)Δ_srv: with R_k empty the new model is the server-trained one."""
    core = local_core(cfg_for({"name": "hfcl"}, rounds=1, id_size=40))
    s = core.strategy
    from raysim.algorithms.feddle.server_training import train_on_server

    want, _ = train_on_server(s.ctx, s.weights, s.ctx.data.id.data, s.ctx.local, "hfcl/0")
    s.on_round_end(0)
    np.testing.assert_allclose(s.weights, want, rtol=0, atol=1e-7)  # ω + (Δ_srv) in float32


def test_hfcl_weights_the_server_like_a_client_of_its_size():
    core = local_core(cfg_for({"name": "hfcl"}, rounds=1, id_size=30))
    s = core.strategy
    w0 = s.weights.copy()
    from raysim.algorithms.feddle.server_training import train_on_server

    trained, _ = train_on_server(s.ctx, w0, s.ctx.data.id.data, s.ctx.local, "hfcl/0")
    d = np.ones_like(w0)
    s.on_arrival(upd(4, d, n=90))
    s.on_round_end(0)
    np.testing.assert_allclose(s.weights, w0 + 0.75 * d + 0.25 * (trained - w0), atol=1e-6)


def _kl_to_teachers(s, weights, teachers, x):
    h, _ = s.ctx.model()
    with torch.no_grad():
        logits = []
        for t in teachers:
            h.set_global(t)
            h.module.eval()
            logits.append(h.module(x).double())
        p = F.softmax(sum(logits) / len(logits), 1)
        h.set_global(weights)
        log_q = F.log_softmax(h.module(x).double(), 1)
    return float(F.kl_div(log_q, p, reduction="batchmean"))


@pytest.mark.parametrize(
    "name,teacher",
    [("feddf", "local_model"), ("feddf_ood", "local_model"), ("feddf_ood", "transplanted")],
)
def test_feddf_distillation_moves_the_student_towards_the_teachers(name, teacher):
    """FedDF-ID on the ID set, FedDF-OOD on a fresh OOD subset each round, both teacher modes
    (Feddle spec §4.8): the KL to the averaged teachers falls on the inputs distilled on."""
    algo = {"name": name, "server_epochs": 5, "server_lr": 1e-3, "feddf_teacher": teacher}
    if name == "feddf_ood":
        algo["ood_samples_per_round"] = 100
        cfg = cfg_for(algo, ood=[{"name": "shapes", "size": 300}])
    else:
        cfg = cfg_for(algo, id_size=60)
    core = local_core(cfg)
    s = core.strategy
    rng = np.random.default_rng(0)
    w0 = s.weights.copy()
    bases = [w0, w0 + rng.normal(0, 0.1, w0.shape), w0]  # client 1 trained a stale model
    ups = [upd(c, rng.normal(0, 0.3, w0.shape), n=10 * (c + 1), base=bases[c]) for c in range(3)]
    for u in ups:
        s.on_arrival(u)
    student0 = w0 + s.round_delta()
    x = s.inputs(0)
    if name == "feddf_ood":
        pool = s.ctx.data.ood["shapes"].data[0]
        assert len(x) == 100 and not torch.equal(x, s.inputs(1))
        assert all((pool == row).all(1).any() for row in x)  # a subset of the pool
    else:
        assert x is s.ctx.data.id.data[0]
    teachers = [u.local_weights if teacher == "local_model" else w0 + u.delta for u in ups]
    before = _kl_to_teachers(s, student0, teachers, x)
    s.on_round_end(0)
    after = _kl_to_teachers(s, s.weights, teachers, x)
    assert after < before
    empty = local_core(cfg).strategy
    w = empty.weights.copy()
    empty.on_round_end(0)
    np.testing.assert_array_equal(empty.weights, w)  # no arrival: unchanged


def test_server_methods_are_deterministic_and_resume(tmp_path):
    """I-16 (in-process, final weights): same seed ⇒ same digest, also across a resume."""
    from raysim.state import checkpoint

    for name in ("fedft", "hfcl", "feddf", "feddf_ood", "ca2fl"):
        algo = {"name": name} | ({"buffer_size": 3} if name == "ca2fl" else {})
        ood = []
        if name == "feddf_ood":
            algo["ood_samples_per_round"] = 50
            ood = [{"name": "shapes", "size": 200}]
        delays = {"kind": "half_normal", "sigma": 1.0}
        cfg = cfg_for(algo, rounds=4, id_size=40, ood=ood, delays=delays)
        a, b = run(cfg), run(cfg)
        assert a.digest() == b.digest(), name
        half = local_core(cfg)
        half.step()
        half.step()
        _, st = checkpoint.unpack(checkpoint.pack({"core": half.state_dict()}, cfg, 2))
        resumed = local_core(cfg)
        resumed.load_state_dict(st["core"])
        while not resumed.done:
            resumed.step()
        assert resumed.digest() == a.digest(), name
