"""Distributed DP (``privacy.secure_aggregation.noise``): the clients' integer noise, its sum at
the server, and its accounting (``raysim.privacy.distributed``) against dp-accounting."""

from __future__ import annotations

import math
from dataclasses import replace

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from raysim.algorithms.base import MethodParams, Update
from raysim.algorithms.context import ServerContext
from raysim.algorithms.general.fedavg import FedAvg
from raysim.config import ConfigError, load_config
from raysim.privacy import distributed
from raysim.privacy.accounting import Schedule
from raysim.privacy.clipping import SHARE_KEY, ClientPrivacy
from raysim.privacy.distributed import IntegerNoise
from raysim.privacy.sampling import AccountedSampling
from raysim.privacy.secagg import PEAK_METRIC
from raysim.privacy.server import PrivacyError, PrivateStrategy
from raysim.privacy.settings import PrivacyConfig
from tests.conftest import EXAMPLES

ORDERS = distributed.ORDERS
KINDS = ("skellam", "discrete_gaussian")


def gaussian(sigma: float):
    return lambda alpha: alpha / (2 * sigma**2)


@pytest.mark.parametrize("z,n,s", [(1.0, 10_000, 100), (0.8, 1000, 20), (2.0, 100, 10)])
def test_amplification_of_the_gaussians_curve_bounds_dp_accountings_exact_analysis(z, n, s):
    def reference(event, relation) -> np.ndarray:
        acc = rdp_privacy_accountant.RdpAccountant(list(ORDERS), relation)
        acc.compose(event)
        return np.array(acc._rdp)

    wor = reference(
        dp_accounting.SampledWithoutReplacementDpEvent(n, s, dp_accounting.GaussianDpEvent(z / 2)),
        dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    ours = [
        distributed.without_replacement_amplified(int(a), s / n, gaussian(z / 2)) for a in ORDERS
    ]
    # Wang, Balle and Kasiviswanathan's Theorem 9 is what dp-accounting computes for the Gaussian
    np.testing.assert_allclose(ours, wor, rtol=1e-9)
    poisson = reference(
        dp_accounting.PoissonSampledDpEvent(s / n, dp_accounting.GaussianDpEvent(z)),
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )
    general = np.array([distributed.poisson_amplified(int(a), s / n, gaussian(z)) for a in ORDERS])
    # Zhu and Wang's general bound: never below the exact sampled Gaussian, and not far above
    assert (general >= poisson * (1 - 1e-12)).all()
    eps = [
        rdp_privacy_accountant.compute_epsilon(ORDERS, 300 * c, 1e-6)[0] for c in (general, poisson)
    ]
    assert eps[1] <= eps[0] <= 1.5 * eps[1]


def noise(kind: str, units: float = 2.0**15, z: float = 1.0, dim: int = 1000) -> IntegerNoise:
    return IntegerNoise(kind, dim, units, z, max_shares=100)


@pytest.mark.parametrize("kind", KINDS)
def test_integer_noise_costs_more_than_the_gaussian_and_tends_to_it_with_resolution(kind):
    for replace_one in (False, True):
        coarse, fine = noise(kind, 2.0**4), noise(kind, 2.0**20)
        for alpha in (2, 8, 64):
            gauss = alpha / (2 * (1.0 / (2 if replace_one else 1)) ** 2)  # z = 1: α/(2σ²)
            assert coarse.rdp(alpha, replace_one) > fine.rdp(alpha, replace_one) >= gauss
            assert fine.rdp(alpha, replace_one) == pytest.approx(gauss, rel=1e-3)


def test_the_rounding_inflates_the_sensitivity_by_half_a_unit_a_coordinate():
    l1, l2 = noise("skellam", 100.0, dim=400).sensitivities(replace_one=False)
    assert l2 == 100.0 + 10.0 and l1 == l2 * 20.0  # Δ₁ ≤ √d·Δ₂ here
    l1, l2 = noise("skellam", 1.0, dim=400).sensitivities(replace_one=True)
    assert l2 == 2 * 11.0 and l1 == 2 * 11.0 * 11.0  # Δ₁ ≤ Δ₂² for integers


def test_the_accountant_is_k_aggregations_of_one_and_calibration_meets_its_target():
    sched = Schedule(1000, 20, "poisson")
    acc = distributed.DistributedAccountant(noise("skellam"), sched, 1e-5)
    eps = [acc.step() for _ in range(3)]
    assert eps == sorted(eps) and eps[0] > 0
    curve = distributed.curve(noise("skellam"), sched)
    assert eps[2] == rdp_privacy_accountant.compute_epsilon(ORDERS, 3 * curve, 1e-5)[0]
    z = distributed.calibrate(2.0, 1e-5, 100, sched, noise("discrete_gaussian"), 50.0)
    at = replace(noise("discrete_gaussian"), noise_multiplier=z)
    assert distributed.epsilon(at, sched, 100, 1e-5) <= 2.0
    assert distributed.epsilon(replace(at, noise_multiplier=z * 0.99), sched, 100, 1e-5) > 2.0


# ----------------------------------------------------------------- the run's mechanism
def strategy(size: int, per_round: int, sampling: str = "without_replacement", **secagg):
    cfg = PrivacyConfig(
        mode="central",
        clip=0.5,
        noise_multiplier=1.5,
        secure_aggregation={"enabled": True, "threshold": 1.0, **secagg},
    )
    sched = AccountedSampling(per_round, Schedule(1000, per_round, sampling))
    inner = FedAvg(MethodParams(), np.zeros(size, np.float32), 1000)
    s = PrivateStrategy(inner, cfg, sched, 1e-5, planned=10)
    s.setup(ServerContext.minimal(0, size, 1000))
    return s, ClientPrivacy(cfg)


def update(client: int, delta: np.ndarray, metrics) -> Update:
    return Update(client, delta, 7, 0, 0, 0.0, 0, 0, np.zeros_like(delta), metrics)


@pytest.mark.parametrize("kind", KINDS)
def test_the_clients_shares_sum_to_noise_of_std_z_c_and_the_server_adds_none(kind):
    size, n = 50_000, 4
    s, client = strategy(size, n, noise=kind)
    down = s.configure(0, list(range(n))).tensors
    share = float(down[SHARE_KEY][0])
    assert share == pytest.approx(1.5 * 0.5 / math.sqrt(n))  # threshold 1: all n must survive
    sent = []
    for c in range(n):
        delta, metrics = client.apply(
            np.zeros(size, np.float32), down, job_seed=100 + c, metrics={}
        )
        # on the grid, with this client's share of the noise, from its job's seed
        assert np.array_equal(np.ldexp(np.rint(np.ldexp(delta, 16)), -16), delta)
        assert np.std(delta) == pytest.approx(share, rel=0.03)
        assert metrics[PEAK_METRIC] == float(np.abs(delta).max())
        again, _ = client.apply(np.zeros(size, np.float32), down, job_seed=100 + c, metrics={})
        assert np.array_equal(delta, again)
        s.on_arrival(update(c, delta, metrics))
        sent.append(delta.astype(np.float64))
    s.on_round_end(0)
    # the mean of the shares over the fixed denominator, nothing added: std z·C/D
    np.testing.assert_allclose(s.weights, np.sum(sent, axis=0) / n, atol=1e-6)
    assert np.std(s.weights) == pytest.approx(1.5 * 0.5 / n, rel=0.03)
    assert s.aggregations == 1 and s.epsilon() > 0


def test_an_empty_poisson_round_under_distributed_noise_releases_the_sums_noise():
    s, _ = strategy(50_000, 4, "poisson", noise="skellam")
    s.on_round_end(0)  # nobody sampled: the server draws what the shares would have carried
    assert s.aggregations == 1
    assert np.std(s.weights) == pytest.approx(1.5 * 0.5 / 4, rel=0.03)


def test_unequal_weights_are_refused_under_distributed_noise():
    from raysim.algorithms.general.fedbuff import FedBuff
    from raysim.algorithms.general.params import FedBuffParams

    cfg = PrivacyConfig(mode="central", secure_aggregation={"enabled": True, "noise": "skellam"})
    inner = FedBuff(FedBuffParams(per_round=True, staleness_weight="inv_sqrt"), np.zeros(4), 1000)
    s = PrivateStrategy(inner, cfg, AccountedSampling(2, Schedule(1000, 2)), 1e-5, planned=10)
    s.setup(ServerContext.minimal(0, 4, 1000))
    s.configure(0, [0, 1])
    for c, tau in ((0, 0), (1, 3)):
        u = update(c, np.zeros(4, np.float32), {})
        s.on_arrival(replace(u, tau_versions=tau))
    with pytest.raises(PrivacyError, match="unequally"):
        s.on_round_end(0)


QUICK = ["rounds=3", "eval.every=3", "tracking.enabled=false", "privacy.mode=central",
         "privacy.clip=0.5", "privacy.secure_aggregation.enabled=true"]  # fmt: skip


def test_config_refuses_distributed_noise_without_what_it_needs():
    cases = {
        "enabled true": ["privacy.secure_aggregation.enabled=false"],
        "accountant rdp": ["privacy.accountant=pld", "clients.sampling=poisson"],
        "adaptive.enabled false": ["privacy.adaptive.enabled=true"],
    }
    for fix, extra in cases.items():
        with pytest.raises(ConfigError, match=fix):
            load_config(EXAMPLES / "quickstart.yaml",
                        [*QUICK, "privacy.secure_aggregation.noise=skellam", *extra])  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["skellam"])
def test_a_distributed_run_reports_the_accountants_epsilon_and_is_reproducible(kind):
    from raysim.actors.local import local_core
    from tests.conftest import resumed_through_checkpoint

    cfg = load_config(EXAMPLES / "quickstart.yaml",
                      [*QUICK, f"privacy.secure_aggregation.noise={kind}"])  # fmt: skip

    def run():
        core = local_core(cfg)
        while not core.done:
            m = core.step()
        return core, m

    core, m = run()
    n, s = cfg.clients.num, cfg.clients.per_round
    expected = distributed.epsilon(
        IntegerNoise(kind, core.strategy.weights.size, 0.5 * 2**16, 1.0, s),
        Schedule(n, s),
        3,
        cfg.privacy.delta_for(n),
    )
    assert m["dp_epsilon"] == expected and m["dp_aggregations"] == 3
    again, _ = run()  # the clients' noise from their jobs' seeds: the same bits
    assert again.digest() == core.digest()
    resumed, _ = resumed_through_checkpoint(cfg, 2)
    assert resumed.digest() == core.digest()
    assert resumed.history[-1]["dp_epsilon"] == expected
