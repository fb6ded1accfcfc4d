"""Synthetic(α, β): the federated classification task of Li et al., "Federated Optimization in
Heterogeneous Networks" (FedProx, MLSys 2020, §5.1), after Shamir et al. (2014), as LEAF
(Caldas et al., 2018) generates it. Any population size works offline: a client's samples are
made from (seed, client id) when the client is dispatched, never for the whole population.

Client k has a softmax-regression model and its own inputs:

- ``W_k`` (60 x 10), ``b_k`` (10) ~ N(u_k, 1), with u_k ~ N(0, α): how much the clients' models
  differ;
- ``x`` ~ N(v_k, Σ), with v_k ~ N(B_k, 1) per feature, B_k ~ N(0, β), and Σ diagonal,
  Σ_jj = j^-1.2: how much their inputs differ;
- ``y`` = argmax softmax(x W_k + b_k).

The iid variant (``iid: true``) gives every client one model W, b ~ N(0, 1) and inputs
x ~ N(B_k 1, Σ) (the paper's Synthetic-IID takes β = 0: the same inputs everywhere).

How many samples a client holds (``sizes``): ``leaf``, LEAF's ``get_num_samples``
(lognormal(3, 2), cast to int, plus 5, at most 1,000: a heavy tail, median about 25), or
``fedprox``, the FedProx generator's (lognormal(4, 2) cast to int, plus 50, no cap). A client's
samples are split into its training rows and held-out rows (``data.test_fraction`` of them, as
FedProx holds out each user's tail); the shared test set is the held-out rows of
``test_clients`` clients drawn from the seed, so evaluation costs nothing per client of the
population.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field

from raysim.schema import StrictModel

SYNTHETIC_TAG = 0x5917  # rng = default_rng([seed, SYNTHETIC_TAG, ...]): one stream per purpose
CLIENT, SIZES, GLOBAL, TEST = 0, 1, 2, 3


class SyntheticConfig(StrictModel):
    """``data.synthetic``: Synthetic(α, β) of FedProx §5.1 (see ``raysim.data.synthetic``)."""

    alpha: float = Field(1.0, ge=0, description="std of u_k: how far clients' models differ")
    beta: float = Field(1.0, ge=0, description="std of B_k: how far clients' inputs differ")
    iid: bool = Field(False, description="one model for all clients (Synthetic-IID)")
    features: int = Field(60, ge=1, description="input dimension (FedProx: 60)")
    classes: int = Field(10, ge=2, description="classes (FedProx: 10)")
    sizes: Literal["leaf", "fedprox"] = Field(
        "leaf",
        description="samples per client: leaf, lognormal(3, 2) + 5 capped at 1000 (LEAF's "
        "generator); fedprox, lognormal(4, 2) + 50 (FedProx's)",
    )
    test_clients: int = Field(
        100, ge=1, description="clients whose held-out rows make the shared test set"
    )


def client_sizes(cfg: SyntheticConfig, num_clients: int, seed: int) -> np.ndarray:
    """Samples of every client, int64 ``(num_clients,)``; client k's count does not depend on
    the population's size (one stream, drawn in order)."""
    rng = np.random.default_rng([seed, SYNTHETIC_TAG, SIZES])
    mean, shift = (3.0, 5) if cfg.sizes == "leaf" else (4.0, 50)
    sizes = rng.lognormal(mean, 2.0, num_clients).astype(np.int64) + shift
    return np.minimum(sizes, 1000) if cfg.sizes == "leaf" else sizes


def held_out(sizes: np.ndarray, test_fraction: float) -> np.ndarray:
    """Held-out rows of each client: ``test_fraction`` of its samples, rounded, leaving at
    least one training row."""
    return np.minimum(np.rint(sizes * test_fraction).astype(np.int64), sizes - 1)


@dataclass(frozen=True)
class ClientModel:
    """Client k's generating model: ``y = argmax(x @ w + b)``, ``x ~ N(mean, diag(var))``."""

    w: np.ndarray
    b: np.ndarray
    mean: np.ndarray
    var: np.ndarray


def feature_variances(features: int) -> np.ndarray:
    """Σ's diagonal: Σ_jj = j^-1.2, j = 1..features."""
    return np.arange(1, features + 1, dtype=np.float64) ** -1.2


def client_model(cfg: SyntheticConfig, seed: int, k: int) -> ClientModel:
    """Client k's model and input distribution, from (seed, k) alone."""
    d, c = cfg.features, cfg.classes
    rng = np.random.default_rng([seed, SYNTHETIC_TAG, CLIENT, k])
    u, big_b = rng.normal(0.0, cfg.alpha), rng.normal(0.0, cfg.beta)
    if cfg.iid:
        shared = np.random.default_rng([seed, SYNTHETIC_TAG, GLOBAL])
        w, b = shared.normal(0.0, 1.0, (d, c)), shared.normal(0.0, 1.0, c)
        mean = np.full(d, big_b)
    else:
        w, b = rng.normal(u, 1.0, (d, c)), rng.normal(u, 1.0, c)
        mean = rng.normal(big_b, 1.0, d)
    return ClientModel(w, b, mean, feature_variances(d))


def client_samples(
    cfg: SyntheticConfig, seed: int, k: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Client k's ``n`` samples: float32 ``(n, features)`` and int64 labels, from (seed, k)."""
    model = client_model(cfg, seed, k)
    rng = np.random.default_rng([seed, SYNTHETIC_TAG, CLIENT, k, 1])
    x = model.mean + rng.standard_normal((n, cfg.features)) * np.sqrt(model.var)
    y = np.argmax(x @ model.w + model.b, axis=1)  # softmax is monotone: its argmax is the logits'
    return x.astype(np.float32), y.astype(np.int64)


def test_set(
    cfg: SyntheticConfig, seed: int, sizes: np.ndarray, held: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shared test set: the held-out rows of ``test_clients`` clients (sorted ids, drawn
    without replacement from the seed); returns (x, y, those clients)."""
    rng = np.random.default_rng([seed, SYNTHETIC_TAG, TEST])
    n = len(sizes)
    chosen = np.sort(rng.choice(n, size=min(cfg.test_clients, n), replace=False))
    xs, ys = [], []
    for k in chosen:
        x, y = client_samples(cfg, seed, int(k), int(sizes[k]))
        xs.append(x[sizes[k] - held[k] :])
        ys.append(y[sizes[k] - held[k] :])
    x, y = np.concatenate(xs), np.concatenate(ys)
    if not len(y):
        raise ValueError(
            "data.synthetic: the test clients hold no rows out; raise data.test_fraction or "
            "data.synthetic.test_clients"
        )
    return x, y, chosen
