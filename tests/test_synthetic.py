"""Synthetic(α, β) of FedProx §5.1 (issue 43): the generator's statistics, clients made on
demand from (seed, client id), and a population of a million that costs only its sizes."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.config import ConfigError, load_config
from raysim.data import build_federated_dataset
from raysim.data.synthetic import (
    SyntheticConfig,
    client_model,
    client_samples,
    client_sizes,
    feature_variances,
)
from tests.conftest import tiny


def synthetic(num: int = 50, **options):
    return load_config(
        tiny(
            data={"name": "synthetic", "synthetic": options},
            clients={"num": num, "per_round": min(num, 10)},
            model={"name": "mlp", "hidden": []},
        )
    )


def test_inputs_have_the_diagonal_covariance_j_to_the_minus_1_2():
    cfg = SyntheticConfig()
    x, _ = client_samples(cfg, seed=0, k=7, n=40_000)
    model = client_model(cfg, 0, 7)
    assert np.allclose(x.mean(axis=0), model.mean, atol=0.02)
    var = x.var(axis=0)
    assert np.allclose(var, feature_variances(60), rtol=0.05)
    assert var[0] == pytest.approx(1.0, rel=0.05) and var[59] == pytest.approx(60**-1.2, rel=0.05)
    off = np.corrcoef(x[:, :5].T) - np.eye(5)
    assert np.abs(off).max() < 0.03  # diagonal: features independent


@pytest.mark.parametrize(("alpha", "beta"), [(0.5, 0.0), (2.0, 1.0)])
def test_clients_models_and_inputs_spread_as_alpha_and_beta_say(alpha, beta):
    """u_k ~ N(0, α) shifts every entry of W_k and b_k; v_k ~ N(B_k, 1), B_k ~ N(0, β)."""
    cfg = SyntheticConfig(alpha=alpha, beta=beta)
    models = [client_model(cfg, 1, k) for k in range(3000)]
    u_hat = np.array(
        [np.concatenate([m.w.ravel(), m.b]).mean() for m in models]
    )  # u_k + N(0, 1/610)
    assert u_hat.std() == pytest.approx(np.sqrt(alpha**2 + 1 / 610), rel=0.08)
    b_hat = np.array([m.mean.mean() for m in models])  # B_k + N(0, 1/60)
    assert b_hat.std() == pytest.approx(np.sqrt(beta**2 + 1 / 60), rel=0.08)
    within = np.array([m.w.std() for m in models])
    assert within.mean() == pytest.approx(1.0, rel=0.03)  # W_k ~ N(u_k, 1) around its own mean


def test_labels_are_the_argmax_of_the_clients_own_model():
    cfg = SyntheticConfig(alpha=1.0, beta=1.0)
    x, y = client_samples(cfg, 2, 11, 500)
    m = client_model(cfg, 2, 11)
    assert np.array_equal(y, np.argmax(x.astype(np.float64) @ m.w + m.b, axis=1))
    other = client_model(cfg, 2, 12)
    assert not np.allclose(other.w, m.w)  # non-iid: every client its own model


def test_the_iid_variant_shares_one_model_and_with_beta_0_one_input_law():
    cfg = SyntheticConfig(iid=True, beta=0.0)
    a, b = client_model(cfg, 3, 0), client_model(cfg, 3, 99)
    assert np.array_equal(a.w, b.w) and np.array_equal(a.b, b.b)
    assert np.array_equal(a.mean, np.zeros(60)) and np.array_equal(b.mean, a.mean)


def test_sizes_follow_leaf_or_fedprox_and_do_not_depend_on_the_population():
    leaf = client_sizes(SyntheticConfig(), 200_000, seed=0)
    assert leaf.min() >= 5 and leaf.max() <= 1000
    assert np.median(leaf) == pytest.approx(np.exp(3) + 5, rel=0.1)  # lognormal(3, 2) + 5
    prox = client_sizes(SyntheticConfig(sizes="fedprox"), 200_000, seed=0)
    assert prox.min() >= 50 and prox.max() > 1000
    assert np.median(prox) == pytest.approx(np.exp(4) + 50, rel=0.1)
    assert np.array_equal(client_sizes(SyntheticConfig(), 1000, seed=0), leaf[:1000])


def test_a_client_is_made_from_seed_and_id_alone():
    small = build_federated_dataset(synthetic(50).data, 50, 4)
    big = build_federated_dataset(synthetic(5000).data, 5000, 4)
    for j in (0, 17, 49):
        xs, ys = small.client_data(j)
        xb, yb = big.client_data(j)
        assert np.array_equal(xs, xb) and np.array_equal(ys, yb)
        assert len(ys) == small.client_sizes()[j] >= 1
    other_seed = build_federated_dataset(synthetic(50).data, 50, 5)
    assert not np.array_equal(other_seed.client_data(0)[0][:1], small.client_data(0)[0][:1])


def test_a_million_clients_cost_their_sizes_and_the_test_set_only():
    cfg = synthetic(1_000_000)
    ds = build_federated_dataset(cfg.data, 1_000_000, 0)
    assert ds.num_clients == 1_000_000 and len(ds.x_train) == 0
    assert ds.client_offsets.nbytes == 8 * 1_000_001
    assert 100 <= len(ds.y_test) < 100 * 1000  # the held-out rows of 100 clients
    x, y = ds.client_data(999_999)
    assert x.shape == (ds.client_sizes()[999_999], 60) and x.dtype == np.float32


def test_held_out_rows_are_not_trained_on():
    ds = build_federated_dataset(synthetic(50).data, 50, 0)
    from raysim.data.synthetic import held_out

    sizes = ds.samples
    assert np.array_equal(ds.client_sizes(), sizes - held_out(sizes, 0.2))
    x_all, _ = client_samples(ds.synthetic, 0, 3, int(sizes[3]))
    x_train, _ = ds.client_data(3)
    assert np.array_equal(x_train, x_all[: len(x_train)]) and len(x_train) < len(x_all)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"name": "synthetic", "partition": {"kind": "iid"}},
            "data.partition applies only to .*, not to name='synthetic': each client",
        ),
        (
            {"name": "digits", "synthetic": {"alpha": 0.5}},
            "data.synthetic applies only to name='synthetic', not to name='digits'",
        ),
        ({"name": "synthetic", "synthetic": {"alfa": 0.5}}, "did you mean 'alpha'"),
    ],
)
def test_synthetic_options_are_checked(data, message):
    with pytest.raises(ConfigError, match=message):
        load_config(tiny(data=data))


def test_fedavg_learns_synthetic_iid_in_process():
    """A run end to end without Ray (``local_core``): FedAvg on Synthetic-IID, 300 clients, a
    logistic regression; the test accuracy rises well above chance."""
    from raysim.actors.local import local_core

    cfg = load_config(
        tiny(
            rounds=10,
            data={"name": "synthetic", "synthetic": {"iid": True, "beta": 0.0}},
            clients={"num": 300, "per_round": 10},
            model={"name": "mlp", "hidden": []},
            local={"epochs": 1, "batch_size": 10, "lr": 0.05},
            eval={"every": 1},
        )
    )
    core = local_core(cfg, evaluate=True)
    while not core.done:
        core.step()
    acc = [h["accuracy"] for h in core.history]
    assert core.final_metrics()["total_updates"] == 100
    assert acc[-1] > max(0.5, acc[0] + 0.1), acc
