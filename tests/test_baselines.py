"""The FedOA paper's baselines on the tiny LLaMA (FedOA spec §3; invariants I17, I18, I21)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.algorithms import get_method
from raysim.algorithms.base import ClientAlgorithm, Update
from raysim.algorithms.fedoa.fedsdr import sdr_regularizer
from raysim.algorithms.fedoa.perada import lora_pairs
from raysim.algorithms.general.fedavg import FedAvg
from raysim.data import build_federated_dataset
from raysim.data.federated import DataConfig
from raysim.data.text_tasks import TextTaskConfig
from raysim.training.loop import LocalTrainingConfig
from tests.test_fedoa import (
    LOCAL,
    client,
    context,
    handle,
    lm_data,
    nonzero_global,
    train_personal_reference,
)

SGD = LocalTrainingConfig(epochs=1, batch_size=8, lr=0.01, optimizer="sgd")


def flat_state(h) -> np.ndarray:
    return np.concatenate([v.ravel() for v in h.get_state().values()])


def one_round(name, seed_state=5, cfg=LOCAL, rnd=0, first=True, **params):
    """A fresh handle with a non-zero global and a fresh personal adapter; one client round."""
    h = handle()
    nonzero_global(h)
    h.set_state(None, seed_state)
    downloaded = h.get_global()
    metrics = client(name, **params).train(context(h, rnd=rnd, first=first, cfg=cfg))
    return h, downloaded, metrics


# ---------------------------------------------------------------- I18: λ = 0 equivalences


def test_zero_lambda_personal_trajectories_are_local_only():
    """I18: PERADA(λ_p=0) = Ditto(λ=0) = FedOA(λ=0) = FedSDR(λ=0) = Local-only, bit for bit."""
    ref, _, _ = one_round("local_only")
    start = handle()
    start.set_state(None, 5)
    assert not np.array_equal(flat_state(ref), flat_state(start))  # the personal adapter trained
    for name in ("fedoa", "ditto", "perada", "fedsdr"):
        h, _, _ = one_round(name, **{"lambda": 0.0})
        np.testing.assert_array_equal(flat_state(h), flat_state(ref), err_msg=name)
    for name in ("ditto", "perada"):  # ... and λ > 0 does change it (the equality is not vacuous)
        h, _, _ = one_round(name, **{"lambda": 1.0})
        assert not np.array_equal(flat_state(h), flat_state(ref)), name


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("ditto", {"lambda": 1.0}),
        ("perada", {"lambda": 1.0}),
        ("perada", {"lambda": 1.0, "prox_on": "delta_W", "squared": False}),
        ("perada", {"param_prox_detached": True}),
        ("fedsdr", {"lambda": 1.0}),
        ("fedlora", {}),
        ("pfedme", {"authors_code": True}),  # round index 0: FedIT on the global copy
        ("centralized", {}),
    ],
)
def test_global_upload_is_fedit(name, params):
    """The uploaded global copy is FedIT's exactly (every baseline but standard pFedMe)."""
    h, downloaded, _ = one_round(name, **params)
    fedit = handle(("global",))
    fedit.set_global(downloaded)
    client("fedit").train(context(fedit))
    assert not np.array_equal(fedit.get_global(), downloaded)
    np.testing.assert_array_equal(h.get_global(), fedit.get_global())


def test_standard_pfedme_global_differs_from_fedit():
    h, downloaded, _ = one_round("pfedme")
    fedit = handle(("global",))
    fedit.set_global(downloaded)
    client("fedit").train(context(fedit))
    assert not np.allclose(h.get_global(), fedit.get_global())
    assert not np.array_equal(h.get_global(), downloaded)


# ---------------------------------------------------------------- penalties


def test_parameter_penalties_match_hand_computation():
    h = handle()
    nonzero_global(h)
    h.set_state(None, 5)
    h.use("personal")
    ctx = context(h)
    v, w = h.get_adapter("personal").astype(np.float64), h.get_adapter("global")
    sq = float(((v - w) ** 2).sum())
    batch = ctx.task.batch(ctx.data, torch.arange(8))
    ce = float(h.module(**batch).loss.detach())

    def loss(name, **params):
        return float(client(name, **params).personal_objective(ctx)(batch).detach())

    assert loss("ditto", **{"lambda": 2.0}) == pytest.approx(ce + 0.5 * 2.0 * sq, rel=1e-5)
    assert loss("perada", **{"lambda": 2.0}) == pytest.approx(ce + 2.0 * sq, rel=1e-5)
    dw = 0.0
    for (a, b), (ga, gb) in zip(
        lora_pairs(h.module, "personal"), lora_pairs(h.module, "global"), strict=True
    ):
        dw += float(((b @ a - gb @ ga) ** 2).sum())
    assert dw > 0
    assert loss("perada", prox_on="delta_W") == pytest.approx(ce + 0.5 * dw, rel=1e-5)
    per_tensor = sum(
        float(torch.linalg.vector_norm(p - q))
        for p, q in zip(
            h.adapter_parameters("personal"), h.adapter_parameters("global"), strict=True
        )
    )
    got = loss("perada", param_prox_detached=True)
    assert got == pytest.approx(ce + 0.5 * per_tensor / 32, rel=1e-5)


def test_perada_detached_prox_is_local_only_i21():
    """I21: the authors'-code detached penalty gives Local-only's personal trajectory; the
    differentiable one does not once φ_e ≠ φ_g (here from the start: fresh A, non-zero global)."""
    ref, _, _ = one_round("local_only")
    det, _, m = one_round("perada", param_prox_detached=True)
    np.testing.assert_array_equal(flat_state(det), flat_state(ref))
    assert m["personal_train_loss"] > one_round("local_only")[2]["personal_train_loss"]
    live, _, _ = one_round("perada", param_prox_detached=False)
    assert not np.allclose(flat_state(live), flat_state(ref))


# ---------------------------------------------------------------- I17: λ limits


def sweep_distance(name: str, lam: float, rounds: int = 2, clients: int = 2) -> float:
    """A 2-client, 2-round toy run; final mean ‖v_e − φ_g^T‖ over clients."""
    cfg = LocalTrainingConfig(epochs=2, batch_size=4, lr=0.005, optimizer="sgd")
    h = handle()
    nonzero_global(h)
    w = h.get_global()
    states: dict[int, dict | None] = dict.fromkeys(range(clients))
    algo = client(name, **{"lambda": lam}, log_feature_distance=False)
    for rnd in range(rounds):
        uploads = []
        for c in range(clients):
            h.set_global(w)
            h.set_state(states[c], seed=100 + c)
            algo.train(
                context(h, lm_data(seed=c), seed=10 * rnd + c, rnd=rnd, first=rnd == 0, cfg=cfg)
            )
            uploads.append(h.get_global())
            states[c] = h.get_state()
        w = np.mean(uploads, axis=0)
    h.set_global(w)
    dists = []
    for c in range(clients):
        h.set_state(states[c], 0)
        dists.append(np.linalg.norm(h.get_adapter("personal") - w))
    return float(np.mean(dists))


@pytest.mark.parametrize("name", ["ditto", "perada"])
def test_final_parameter_distance_non_increasing_in_lambda_i17(name):
    d = [sweep_distance(name, lam) for lam in (0.0, 1.0, 100.0)]
    assert d[0] >= d[1] >= d[2], d
    assert d[2] < 0.5 * d[0], d  # λ = 100 pulls v essentially onto the global


# ---------------------------------------------------------------- pFedMe


def test_pfedme_huge_lambda_gives_w_close_to_theta():
    """I18: pFedMe with λ_p → ∞ gives w_e ≈ θ_e (η_p λ_p = η λ_p = 0.5 keeps SGD stable)."""
    lam, cfg = 1e4, SGD.model_copy(update={"batch_size": 4})  # 2 minibatches: (1/64)² of d0
    h, downloaded, m = one_round(
        "pfedme", cfg=cfg, lr_personal=0.5 / lam, lr_global=0.5 / lam, **{"lambda": lam}
    )
    start = handle()
    start.set_state(None, 5)
    d0 = np.linalg.norm(start.get_adapter("personal") - downloaded)
    d1 = np.linalg.norm(h.get_adapter("personal") - h.get_global())
    assert d1 < 1e-2 * d0 and m["param_distance"] == pytest.approx(d1, rel=1e-4)
    small, _, _ = one_round("pfedme", cfg=SGD, **{"lambda": 0.1})
    assert np.linalg.norm(small.get_adapter("personal") - small.get_global()) > 0.5 * d0


def test_pfedme_inner_and_outer_steps_match_a_hand_rolled_update():
    """One minibatch (batch = all 8 rows), K_in = 2 SGD steps, then the outer step."""
    lam, eta_p, eta = 3.0, 0.02, 0.05
    h, downloaded, _ = one_round(
        "pfedme", cfg=SGD, inner_steps=2, lr_personal=eta_p, lr_global=eta, **{"lambda": lam}
    )
    ref = handle()
    ref.set_global(downloaded)
    ref.set_state(None, 5)
    ref.use("personal")
    theta, w = ref.adapter_parameters("personal"), ref.adapter_parameters("global")
    data = lm_data()
    for _ in range(2):
        for p in theta:
            p.grad = None
        loss = ref.module(**data).loss + 0.5 * lam * sum(
            ((t - q.detach()) ** 2).sum() for t, q in zip(theta, w, strict=True)
        )
        loss.backward()
        with torch.no_grad():
            for t in theta:
                t -= eta_p * t.grad
    with torch.no_grad():
        for q, t in zip(w, theta, strict=True):
            q -= eta * lam * (q - t)
    np.testing.assert_allclose(h.get_global(), ref.get_global(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(flat_state(h), flat_state(ref), rtol=1e-5, atol=1e-7)


def test_pfedme_authors_code_rounds_after_the_first():
    """Code mode, round ≥ 1: personal = plain CE training (as Local-only), global = one step
    w ← w − 2λη(w − θ_p) with no data pass."""
    lam = 0.5
    h, downloaded, _ = one_round("pfedme", rnd=1, first=False, authors_code=True)
    ref, _, _ = one_round("local_only", rnd=1, first=False)
    np.testing.assert_array_equal(flat_state(h), flat_state(ref))
    theta = h.get_adapter("personal")
    expect = downloaded - np.float32(2 * lam * LOCAL.lr) * (downloaded - theta)
    np.testing.assert_allclose(h.get_global(), expect, rtol=1e-6, atol=1e-8)


def _update(delta, base, n) -> Update:
    d, b = np.asarray(delta, np.float32), np.asarray(base, np.float32)
    return Update(0, d, n, 0, 0, 0.0, 0, 0, b)


def test_pfedme_server_beta():
    w0 = np.array([1.0, 2.0], np.float32)
    ups = [_update([1.0, 0.0], w0, 30), _update([0.0, 4.0], w0, 10)]
    method = get_method("pfedme")
    fedavg = FedAvg(method.params(), w0, 2)
    outs = {}
    for beta in (1.0, 0.5):
        s = method.build_strategy({"beta": beta}, w0, 2)
        for u in ups:
            s.on_arrival(u)
            if beta == 1.0:
                fedavg.on_arrival(u)
        assert s.on_round_end(0)
        outs[beta] = s.weights
    fedavg.on_round_end(0)
    np.testing.assert_array_equal(outs[1.0], fedavg.weights)  # β = 1 is FedAvg bit for bit
    mean = w0 + np.array([0.75, 1.0], np.float32)
    np.testing.assert_allclose(outs[0.5], 0.5 * w0 + 0.5 * mean, rtol=1e-6)


# ---------------------------------------------------------------- FedLoRA


def test_fedlora_personal_starts_at_downloaded_global():
    """I18: θ_e ← φ_g (the downloaded global), then K_ft CE epochs; rebuilt, not persisted."""
    h, downloaded, _ = one_round("fedlora", finetune_epochs=0)
    np.testing.assert_array_equal(h.get_adapter("personal"), downloaded)
    h1, downloaded, _ = one_round("fedlora", finetune_epochs=1)
    h2, _, _ = one_round("fedlora", seed_state=77, finetune_epochs=1)  # another prior state
    ref = handle()
    ref.set_adapter("personal", downloaded)
    train_personal_reference(ref, context(ref))
    np.testing.assert_array_equal(h1.get_adapter("personal"), ref.get_adapter("personal"))
    np.testing.assert_array_equal(h2.get_adapter("personal"), h1.get_adapter("personal"))
    assert not np.array_equal(h1.get_adapter("personal"), downloaded)


# ---------------------------------------------------------------- FedSDR


def test_sdr_regularizer_matches_hand_computation():
    rng = np.random.default_rng(3)
    e, g = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    gbar = g.mean(axis=0)
    hand = np.mean([abs(np.dot(e[b], np.abs(g[b] - gbar))) for b in range(5)])
    got = sdr_regularizer(torch.tensor(e), torch.tensor(g))
    assert float(got) == pytest.approx(hand, rel=1e-12)
    # teacher features carry no gradient; the student's do
    et = torch.tensor(e, requires_grad=True)
    gt = torch.tensor(g, requires_grad=True)
    sdr_regularizer(et, gt).backward()
    assert gt.grad is None and torch.count_nonzero(et.grad) > 0


def test_fedsdr_objective_is_ce_plus_lambda_r_sdr():
    h = handle()
    nonzero_global(h)
    h.set_state(None, 5)
    ctx = context(h)
    batch = ctx.task.batch(ctx.data, torch.arange(8))
    m = h.module
    m.eval()
    with torch.no_grad():
        h.use("global")
        hidden = m(**batch, output_hidden_states=True).hidden_states[-1]
        last = batch["attention_mask"].sum(1) - 1  # right padding
        g = hidden[torch.arange(8), last].double().numpy()
        h.use("personal")
        out = m(**batch, output_hidden_states=True)
        e = out.hidden_states[-1][torch.arange(8), last].double().numpy()
    r = np.mean(np.abs((e * np.abs(g - g.mean(0))).sum(1)))
    assert r > 0
    h.use("personal")
    got = client("fedsdr", **{"lambda": 0.7}).personal_objective(ctx)(batch)
    assert float(got) == pytest.approx(float(out.loss) + 0.7 * r, rel=1e-5)


# ---------------------------------------------------------------- Centralized


def real_rows(client_data: dict) -> list[tuple[int, ...]]:
    ids, mask = client_data["input_ids"], client_data["attention_mask"].astype(bool)
    return [tuple(r[m]) for r, m in zip(ids, mask, strict=True)]


def test_centralized_pools_every_training_example_on_one_client():
    text = {"n_train": 8, "n_test": 4}
    pooled = build_federated_dataset(
        DataConfig(name="flan_mini", text=TextTaskConfig(pool_clients=True, **text)), 1, seed=0
    )
    split = build_federated_dataset(DataConfig(name="flan_mini", text=TextTaskConfig(**text)), 6, 0)
    assert pooled.num_clients == 1 and pooled.client_sizes().tolist() == [48]
    assert sorted(pooled.eval_sets) == ["id/0", "ood"]
    id0 = pooled.eval_sets["id/0"]
    assert id0.client == 0 and len(id0) == 24 and set(id0.tasks) == set(split.client_tasks)
    assert pooled.eval_sets["ood"].references == split.eval_sets["ood"].references
    rows = [r for c in split.clients for r in real_rows(c)]
    assert real_rows(pooled.clients[0]) == rows  # same examples, same order
    with pytest.raises(ValueError, match="pool_clients=true needs num_clients=1"):
        build_federated_dataset(
            DataConfig(name="flan_mini", text=TextTaskConfig(pool_clients=True, **text)), 6, 0
        )
    method = get_method("centralized")
    assert method.strategy is FedAvg and method.client is ClientAlgorithm
    assert method.evaluate_with == "global" and [g.name for g in method.groups] == ["global"]
