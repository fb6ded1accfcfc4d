"""User-level differential privacy (``privacy:``): clipping on the workers, Gaussian noise on the
server's sums, the accountant's ε, adaptive clipping, a budget that ends a run, and determinism.

The accountant's own checks against ``dp-accounting`` are in ``test_privacy_accounting.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysim.algorithms.base import Update
from raysim.algorithms.context import ServerContext
from raysim.algorithms.general.fedavg import FedAvg
from raysim.algorithms.spec import MethodParams
from raysim.config import ConfigError, load_config
from raysim.privacy.clipping import CLIP_KEY, WITHIN_METRIC, ClientPrivacy, clip
from raysim.privacy.sampling import AccountedSampling
from raysim.privacy.server import PrivacyError, PrivateStrategy
from raysim.privacy.settings import PrivacyConfig
from tests.conftest import EXAMPLES

QUICK = ["rounds=3", "eval.every=3", "tracking.enabled=false"]
#: FedBuff with K = S and no delays flushes once a round, weighting every update 1/K whatever its
#: size: the weights DP-FedAvg gives (w_k = 1, a denominator of D = K), so privacy that clips and
#: noises nothing must leave the run's bits as they are
BUFFER = ["algorithm.name=fedbuff", "algorithm.buffer_size=10"]


def core_of(*overrides: str):
    from raysim.actors.local import local_core

    return local_core(load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides]))


def run(*overrides: str):
    core = core_of(*overrides)
    while not core.done:
        core.step()
    return core


def update(client: int, delta: np.ndarray, metrics=None) -> Update:
    return Update(client, delta, 7, 0, 0, 0.0, 0, 0, np.zeros_like(delta), metrics or {})


def private_fedavg(size: int, per_round: int, **privacy) -> PrivateStrategy:
    from raysim.privacy.accounting import Schedule

    cfg = PrivacyConfig(mode="central", **privacy)
    sampling = AccountedSampling(per_round, Schedule(1000, per_round))
    s = PrivateStrategy(FedAvg(MethodParams(), np.zeros(size, np.float32), 1000), cfg, sampling,
                        1e-5, planned=100)  # fmt: skip
    s.setup(ServerContext.minimal(0, size, 1000))
    return s


# ----------------------------------------------------------------- clipping, on the worker
def test_clip_scales_down_to_the_bound_and_leaves_shorter_deltas_alone():
    d = np.full(100, 0.5, np.float32)  # norm 5
    c, norm = clip(d, 1.0)
    assert norm == pytest.approx(5.0) and np.linalg.norm(c) == pytest.approx(1.0, rel=1e-6)
    assert np.allclose(c / np.linalg.norm(c), d / 5.0)
    same, _ = clip(d, 10.0)
    assert same is d


def test_local_noise_has_std_z_times_c_and_comes_from_the_jobs_seed():
    p = ClientPrivacy(PrivacyConfig(mode="local", clip=0.5, noise_multiplier=2.0))
    zero = np.zeros(200_000, np.float32)
    noised, m = p.apply(zero, {}, job_seed=11, metrics={})
    assert m[WITHIN_METRIC] == 1.0
    assert np.std(noised) == pytest.approx(1.0, rel=0.01)  # z·C = 2 · 0.5
    again, _ = p.apply(zero, {}, job_seed=11, metrics={})
    other, _ = p.apply(zero, {}, job_seed=12, metrics={})
    assert np.array_equal(noised, again) and not np.array_equal(noised, other)


def test_the_servers_clip_norm_reaches_the_client_in_its_downlink():
    p = ClientPrivacy(PrivacyConfig(mode="central", clip=1.0))
    d = np.full(100, 0.5, np.float32)  # norm 5
    out, m = p.apply(d, {CLIP_KEY: np.array([2.0])}, 0, {})
    assert np.linalg.norm(out) == pytest.approx(2.0, rel=1e-6) and m[WITHIN_METRIC] == 0.0


@pytest.mark.slow
def test_every_clients_delta_is_clipped_inside_batched_groups():
    bound = 0.05
    core = core_of("workers.execution=batched", "workers.group_size=5", "privacy.mode=central",
                   f"privacy.clip={bound}", "privacy.noise_multiplier=0")  # fmt: skip
    assert core.executor.runner.group_size > 1  # the round's clients trained in groups
    norms, within = [], []
    inner = core.strategy.base.on_arrival

    def record(u):
        norms.append(float(np.linalg.norm(np.asarray(u.delta, np.float64))))
        within.append(u.metrics[WITHIN_METRIC])
        return inner(u)

    core.strategy.base.on_arrival = record
    while not core.done:
        core.step()
    assert len(norms) == 30
    assert max(norms) <= bound * (1 + 1e-5)
    assert min(within) == 0.0  # some were longer than C: the clip did cut them


# ----------------------------------------------------------------- the server's noise
def test_the_noise_on_an_aggregate_has_the_stated_variance():
    z, c, size, s = 1.5, 0.2, 200_000, 4
    strategy = private_fedavg(size, s, clip=c, noise_multiplier=z)
    rng = np.random.default_rng(0)
    draws = []
    for r in range(3):
        before = strategy.weights.copy()
        ds = [(rng.standard_normal(size) * 1e-4).astype(np.float32) for _ in range(s)]
        for j, d in enumerate(ds):
            strategy.on_arrival(update(j, d))
        strategy.on_round_end(r)
        mean = np.sum([d.astype(np.float64) for d in ds], axis=0) / s
        draws.append(strategy.weights - before - mean)
    noise = np.concatenate(draws)
    # (Σ clip(Δ) + N(0, z²C²)) / D with D = S: the mean's noise has std z·C/S
    expected = z * c / s
    assert abs(np.mean(noise)) < 4 * expected / math.sqrt(noise.size)
    se = math.sqrt(2 / noise.size)  # relative standard error of a variance estimate
    assert abs(np.var(noise) / expected**2 - 1) < 4 * se
    assert strategy.aggregations == 3


def test_a_round_with_fewer_arrivals_keeps_the_fixed_denominator():
    strategy = private_fedavg(10, 4, clip=100.0, noise_multiplier=0.0)
    ones = np.ones(10, np.float32)
    strategy.on_arrival(update(0, ones))
    strategy.on_arrival(update(1, ones))
    strategy.on_round_end(0)
    # two of the four expected: Σ/D = 2/4, not the arrived clients' mean 1
    assert np.allclose(strategy.weights, 0.5)


def test_an_update_that_carries_more_than_its_delta_is_refused():
    strategy = private_fedavg(10, 4)
    u = Update(0, np.ones(10, np.float32), 1, 0, 0, 0.0, 0, 0, np.zeros(10, np.float32),
               {}, {"dual": np.ones(3, np.float32)})  # fmt: skip
    with pytest.raises(PrivacyError, match="dual"):
        strategy.on_arrival(u)


# ----------------------------------------------------------------- whole runs, in-process
def private_poisson(inner, per_round: int = 4, notices=(), **privacy) -> PrivateStrategy:
    from raysim.privacy.accounting import Schedule

    cfg = PrivacyConfig(mode="central", **privacy)
    sampling = AccountedSampling(per_round, Schedule(1000, per_round, "poisson"), notices)
    s = PrivateStrategy(inner, cfg, sampling, 1e-5, planned=100)
    s.setup(ServerContext.minimal(0, inner.weights.size, 1000))
    return s


def test_an_empty_poisson_round_releases_noise_alone_and_is_counted():
    z, c, size, s = 1.5, 0.2, 200_000, 4
    strategy = private_poisson(FedAvg(MethodParams(), np.zeros(size, np.float32), 1000), s,
                               clip=c, noise_multiplier=z)  # fmt: skip
    strategy.on_round_end(0)  # nobody sampled
    noise = strategy.weights.astype(np.float64)
    assert strategy.aggregations == 1 and strategy.epsilon() > 0
    expected = z * c / s  # (0 + N(0, z²C²)) / D
    se = math.sqrt(2 / noise.size)
    assert abs(np.var(noise) / expected**2 - 1) < 4 * se
    # the next round, with a client, draws other noise (aggregation 2's stream)
    strategy.on_arrival(update(0, np.zeros(size, np.float32)))
    strategy.on_round_end(1)
    assert strategy.aggregations == 2
    assert not np.allclose(strategy.weights, 2 * noise)


def test_an_empty_round_releases_nothing_where_the_analysis_does_not_count_it():
    from raysim.algorithms.general.fedbuff import FedBuff
    from raysim.algorithms.general.params import FedBuffParams
    from raysim.privacy.sampling import NO_AMPLIFICATION

    zeros = np.zeros(8, np.float32)
    cases = {
        "fixed-size sampling": private_fedavg(8, 4, noise_multiplier=1.0),
        "delays (no amplification)": private_poisson(
            FedAvg(MethodParams(), zeros, 1000), notices=(NO_AMPLIFICATION,)
        ),
        "FedBuff's buffer": private_poisson(FedBuff(FedBuffParams(buffer_size=1), zeros, 1000)),
    }
    for why, strategy in cases.items():
        strategy.on_round_end(0)
        assert strategy.aggregations == 0, why
        assert not strategy.weights.any(), why
    per_round = private_poisson(FedBuff(FedBuffParams(per_round=True), zeros, 1000))
    per_round.on_round_end(0)
    assert per_round.aggregations == 1 and per_round.weights.any()


@pytest.mark.slow
def test_no_noise_and_no_clip_leave_the_runs_bits_as_they_are():
    plain = run(*BUFFER).digest()
    assert run(*BUFFER, "privacy.mode=central", "privacy.noise_multiplier=0",
               "privacy.clip=1e9").digest() == plain  # fmt: skip
    # and the noise does change them
    assert run(*BUFFER, "privacy.mode=central", "privacy.clip=1e9",
               "privacy.noise_multiplier=1e-9").digest() != plain  # fmt: skip


@pytest.mark.slow
def test_no_noise_with_a_finite_clip_equals_clipping_by_hand(monkeypatch):
    from raysim.actors import worker

    bound = 0.05
    clipped = run(*BUFFER, "privacy.mode=central", "privacy.noise_multiplier=0",
                  f"privacy.clip={bound}").digest()  # fmt: skip
    # the same run without privacy, each delta clipped by hand where the worker makes it
    result = worker.ClientRunner._result

    def by_hand(self, weights, job, ctx, active, metrics, trained=None):
        r = result(self, weights, job, ctx, active, metrics, trained)
        norm = float(np.linalg.norm(r.delta.astype(np.float64)))
        if norm > bound:
            r.delta = (r.delta * np.float32(bound / norm)).astype(np.float32)
        return r

    monkeypatch.setattr(worker.ClientRunner, "_result", by_hand)
    assert run(*BUFFER).digest() == clipped
    monkeypatch.undo()
    assert run(*BUFFER).digest() != clipped


@pytest.mark.slow
def test_the_reported_epsilon_is_dp_accountings_for_the_same_events():
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    core = run("privacy.mode=central", "privacy.noise_multiplier=1.3")
    n, s = 100, 10
    for k, m in enumerate(core.history, start=1):
        acc = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        # fixed-size sampling, replace-one: a clipped sum's sensitivity is 2C, so σ = z/2
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            n, s, dp_accounting.GaussianDpEvent(1.3 / 2)
        )
        acc.compose(event, k)
        assert m["dp_epsilon"] == pytest.approx(acc.get_epsilon(n**-1.1), rel=1e-9)
        assert m["dp_aggregations"] == k


@pytest.mark.slow
def test_a_spent_budget_ends_the_run_as_a_finished_one():
    free = run("privacy.mode=central", "privacy.noise_multiplier=1.0", "rounds=6")
    eps = [m["dp_epsilon"] for m in free.history]
    budget = (eps[2] + eps[3]) / 2  # three rounds fit, a fourth would not
    core = run("privacy.mode=central", "privacy.noise_multiplier=1.0", "rounds=6",
               f"privacy.epsilon_budget={budget}")  # fmt: skip
    assert core.round == 3 and core.done and core.stop_reason
    assert core.history[-1]["stopped_early"] == 1.0
    assert core.history[-1]["dp_epsilon"] <= budget < eps[3]
    assert "budget" in core.stop_reason


@pytest.mark.slow
def test_target_epsilon_sets_the_noise_before_the_first_round():
    core = run("privacy.mode=central", "privacy.target_epsilon=5", "rounds=3")
    final = core.history[-1]
    assert final["dp_epsilon"] <= 5.0
    assert final["dp_epsilon"] == pytest.approx(5.0, rel=0.02)
    assert final["dp_noise_multiplier"] != 1.0


def test_an_unreachable_target_is_refused_in_one_line():
    from raysim.privacy.accounting import TargetNotReachable

    with pytest.raises(TargetNotReachable) as err:
        core_of("privacy.mode=central", "privacy.target_epsilon=0.001",
                "privacy.max_noise_multiplier=2")  # fmt: skip
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_dp_runs_resume_to_the_same_bits():
    from tests.conftest import resumed_through_checkpoint

    overrides = [
        "privacy.mode=central",
        "privacy.adaptive.enabled=true",
        "rounds=4",
        "privacy.noise_multiplier=0.5",
    ]  # 2·σ_b = 2·S/20 = 1 > z: the split exists
    whole = run(*overrides)
    cfg = load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides])
    resumed, _ = resumed_through_checkpoint(cfg, 2)
    assert resumed.digest() == whole.digest()
    assert resumed.history[-1]["dp_epsilon"] == whole.history[-1]["dp_epsilon"]
    assert resumed.history[-1]["dp_clip"] == whole.history[-1]["dp_clip"]


# ----------------------------------------------------------------- adaptive clipping
def test_adaptive_clipping_follows_its_quantile_of_a_known_norm_distribution():
    gamma, size = 0.3, 8
    strategy = private_fedavg(size, 50, clip=5.0, noise_multiplier=1.0,
                              adaptive={"enabled": True, "target_quantile": gamma,
                                        "learning_rate": 0.2, "count_stddev": 1.0})  # fmt: skip
    client = ClientPrivacy(strategy.privacy)
    rng = np.random.default_rng(3)
    direction = np.ones(size, np.float32) / math.sqrt(size)
    for r in range(400):
        down = strategy.configure(r, list(range(50))).tensors
        for j, norm in enumerate(rng.lognormal(0.0, 0.5, 50)):
            d, m = client.apply(direction * np.float32(norm), down, 0, {})
            strategy.on_arrival(update(j, d, m))
        strategy.on_round_end(r)
    quantile = math.exp(0.5 * -0.5244)  # the 0.3 quantile of lognormal(0, 0.5): e^(σ·Φ⁻¹(0.3))
    assert strategy.clip == pytest.approx(quantile, rel=0.1)
    assert strategy.metrics()["dp_clip"] == strategy.clip


# ----------------------------------------------------------------- refusals, sampling
def test_a_method_that_needs_each_update_is_refused_privacy_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(EXAMPLES / "quickstart.yaml", ["privacy.mode=central",
                                                    "algorithm.name=fedasync"])  # fmt: skip
    assert "fedasync needs each update" in str(err.value) and "\n" not in str(err.value)


def test_pld_needs_poisson_sampling():
    with pytest.raises(ConfigError, match="poisson"):
        load_config(EXAMPLES / "quickstart.yaml", ["privacy.mode=central",
                                                    "privacy.accountant=pld"])  # fmt: skip
    cfg = load_config(EXAMPLES / "quickstart.yaml", ["privacy.mode=central",
                      "privacy.accountant=pld", "clients.sampling=poisson"])  # fmt: skip
    assert cfg.privacy.accountant == "pld"


def test_poisson_sampling_draws_a_size_that_varies_around_per_round():
    from raysim.sim.clock import Schedule
    from raysim.sim.delays import NoDelayParams, build_delay_model

    def none():
        return build_delay_model(NoDelayParams(), 1000, 0)

    s = Schedule(1000, 20, none(), 0, "poisson")
    sizes = [len(s.dispatch(k)) for k in range(400)]
    assert len(set(sizes)) > 5
    assert np.mean(sizes) == pytest.approx(20, rel=0.05)
    assert np.var(sizes) == pytest.approx(1000 * 0.02 * 0.98, rel=0.2)  # binomial
    u = Schedule(1000, 20, none(), 0)
    assert {len(u.dispatch(k)) for k in range(10)} == {20}


def test_delays_turn_off_amplification_by_sampling_and_say_so():
    from raysim.privacy.sampling import NO_AMPLIFICATION, sampling_of

    sync = sampling_of(load_config(EXAMPLES / "quickstart.yaml", ["privacy.mode=central"]))
    assert sync.accounted.per_round == 10 and not sync.notices
    late = sampling_of(load_config(EXAMPLES / "quickstart.yaml", [
        "privacy.mode=central", "delays.kind=half_normal"]))  # fmt: skip
    assert late.accounted.per_round == 100 and late.notices == (NO_AMPLIFICATION,)


@pytest.mark.matrix  # suite time: three runs on a Ray pool (~1 min)
def test_dp_runs_give_the_same_bits_on_1_2_and_4_workers_summed_where_they_are_and_through_a_kill(
    ray_cluster,
):
    """Central DP with adaptive clipping on Ray: updates whole on 2 workers, summed on their node
    on 1 worker, and on 4 workers with one killed in round 1, all end with the in-process run's
    weights, ε and C (the noise and the count's noise come from the run's seeded streams)."""
    import raysim

    dp = ["privacy.mode=central", "privacy.adaptive.enabled=true", "privacy.noise_multiplier=0.5"]
    dp += ["workers.group_size=3"]  # four groups of a round's ten clients: one per worker of 4
    ref = run(*dp)
    on_ray = [*QUICK, *dp, "runtime=ray", "workers.transport=calls"]
    whole = raysim.run(EXAMPLES / "quickstart.yaml", [*on_ray, "workers.count=2",
                                                      "workers.partial_sums=false"])  # fmt: skip
    one = raysim.run(EXAMPLES / "quickstart.yaml", [*on_ray, "workers.count=1",
                                                    "workers.partial_sums=true"])  # fmt: skip
    kill = ["workers.count=4", "workers.num_cpus=0.5"]
    kill += ["faults.kill_worker.round=1", "faults.kill_worker.worker=1"]
    four = raysim.run(EXAMPLES / "quickstart.yaml", [*on_ray, *kill, "workers.partial_sums=true"])
    assert sum(h["worker_restarts"] for h in four.history) == 1
    assert ref.digest() == whole.weights_digest == one.weights_digest == four.weights_digest
    for r in (whole, one, four):
        assert r.metrics["dp_epsilon"] == ref.history[-1]["dp_epsilon"]
        assert r.metrics["dp_clip"] == ref.history[-1]["dp_clip"] != 1.0  # C moved


# ----------------------------------------------------------------- secure aggregation, simulated
SECAGG = ["privacy.mode=central", "privacy.secure_aggregation.enabled=true"]


def test_a_modular_sum_that_could_wrap_is_refused_before_the_first_round():
    from raysim.errors import PrivacyError

    # 10 clients · rint(1·2^6) = 640 units > 2^7 − 1: an 8-bit sum could wrap
    with pytest.raises(PrivacyError, match="modulus_bits") as err:
        core_of(*SECAGG, "privacy.secure_aggregation.modulus_bits=8",
                "privacy.secure_aggregation.scale_bits=6")  # fmt: skip
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_the_server_learns_the_decoded_modular_sum_of_the_survivors():
    from raysim.privacy import secagg

    core = core_of(*SECAGG, "privacy.noise_multiplier=0", "privacy.clip=0.05")
    seen: list[np.ndarray] = []
    inner = core.strategy.base.on_arrival

    def record(u):
        seen.append(np.asarray(u.delta, np.float32).copy())
        return inner(u)

    core.strategy.base.on_arrival = record
    before = core.strategy.weights.copy()
    m = core.step()
    cfg = secagg.SecAggConfig(modulus_bits=32, scale_bits=16, clip=0.05)
    learned = secagg.secure_sum(seen, cfg)  # encoded, summed modulo 2^32, decoded
    assert len(seen) == 10 and m["secagg_survivors"] == 10 and m["secagg_round_failed"] == 0
    # each client's delta sits on the encoding's grid: the exact sum is the modular one
    assert all(np.array_equal(np.rint(d * 2.0**16) / 2.0**16, d) for d in seen)
    step = core.strategy.weights.astype(np.float64) - before
    assert np.allclose(step, learned / 10, rtol=0, atol=1e-7)
    assert m["secagg_bytes_up"] > m["bytes_up"]  # masked vectors of 32 bits, keys and shares


@pytest.mark.slow
def test_a_round_whose_survivors_fall_below_the_threshold_yields_no_update():
    core = core_of(*SECAGG, "privacy.noise_multiplier=0", "privacy.clip=0.05", "rounds=6",
                   "privacy.secure_aggregation.dropout=0.5",
                   "privacy.secure_aggregation.threshold=0.6")  # fmt: skip
    failed = changed = 0
    while not core.done:
        before = core.strategy.weights.copy()
        m = core.step()
        moved = not np.array_equal(before, core.strategy.weights)
        assert moved == (m["secagg_round_failed"] == 0.0)
        assert (m["secagg_survivors"] >= 6) == moved
        failed += int(not moved)
        changed += int(moved)
    assert failed and changed  # both kinds of round happened
    assert core.history[-1]["secagg_failed_rounds"] == failed
    assert core.history[-1]["dp_aggregations"] == changed  # a failed round releases nothing


def test_adaptive_clipping_releases_its_count_only_in_rounds_that_release_a_sum():
    from raysim.algorithms.general.fedbuff import FedBuff
    from raysim.algorithms.general.params import FedBuffParams
    from raysim.privacy.accounting import Schedule

    cfg = PrivacyConfig(mode="central", noise_multiplier=0.5, adaptive={"enabled": True})
    inner = FedBuff(FedBuffParams(buffer_size=20), np.zeros(4, np.float32), 1000)
    s = PrivateStrategy(inner, cfg, AccountedSampling(10, Schedule(1000, 10)), 1e-5, 100)
    s.setup(ServerContext.minimal(0, 4, 1000))
    assert s.denominator == 20  # FedBuff's K: its fixed denominator
    for r in range(2):
        for j in range(10):
            s.on_arrival(update(10 * r + j, np.ones(4, np.float32), {WITHIN_METRIC: 1.0}))
        s.on_round_end(r)
        # round 0 filled half the buffer: no sum, so no count either (the accountant saw none)
        assert (s.aggregations, s.clip == 1.0) == ((0, True) if r == 0 else (1, False))


@pytest.mark.matrix  # suite time (~30 s): the example end to end, shortened
def test_the_privacy_example_runs_and_its_audit_stays_below_the_accountant(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = tmp_path / "table.md"
    proc = subprocess.run(
        [sys.executable, "examples/privacy/accuracy_vs_epsilon.py", "--rounds", "4",
         "--noise", "0.5", "--audit-noise", "0.3", "--plot", str(tmp_path / "p.png"),
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = out.read_text().splitlines()
    assert rows[2].startswith("| no privacy |") and rows[3].startswith("| 0.5 |")
    audit = rows[-1].split("|")  # | 0.3 | ε | bound | correct / guesses |
    assert audit[1].strip() == "0.3" and float(audit[3]) <= float(audit[2])
    assert (tmp_path / "p.png").stat().st_size > 10_000


@pytest.mark.matrix  # suite time: a tiny foundation pre-trained for 3 steps, then 4 short runs
# (the pre-training also checks raysim pretrain's portable kernels)
def test_the_privacy_example_runs_fedit_on_a_tiny_llama(tmp_path):
    import os
    import subprocess
    import sys

    from raysim.models.foundation import foundation_metadata
    from tests.conftest import ROOT

    found = tmp_path / "tiny"
    # whatever the environment asks, raysim pretrain pins portable kernels (issue 62)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2"}
    pre = subprocess.run([sys.executable, "-m", "raysim.cli", "pretrain", "tiny-llama", "--out",
                          str(found), "--steps", "3"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=env)  # fmt: skip
    assert pre.returncode == 0, pre.stderr[-3000:]
    machine = foundation_metadata(found)["machine"]
    assert machine["kernels"] == "portable" and machine["cpu_capability"] == "DEFAULT"
    assert machine["torch_threads"] == 1 and machine["MKL_CBWR"] == "COMPATIBLE"
    assert "portable kernels: DEFAULT" in " ".join(pre.stdout.split())
    out = tmp_path / "table.md"
    proc = subprocess.run(
        [sys.executable, "examples/privacy/accuracy_vs_epsilon.py", "--workload", "fedit",
         "--rounds", "2", "--noise", "0,1", "--foundation", str(found),
         "--plot", str(tmp_path / "p.png"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = out.read_text().splitlines()
    assert rows[0] == "| z | ID loss | ID ROUGE-1 | OOD loss | ε (accountant) |"
    assert rows[2].startswith("| no privacy |") and rows[3].startswith("| 0 |")
    assert rows[4].startswith("| 1 |") and float(rows[4].split("|")[-2]) > 0
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_the_wrapper_keeps_the_secrets_and_private_artifacts_of_what_it_wraps():
    from raysim.algorithms.base import Secret
    from raysim.algorithms.hooks import ComposedStrategy, Mixer
    from raysim.algorithms.spec import HookParams
    from raysim.privacy.accounting import Schedule

    class Keeper(Mixer):
        def secrets(self):
            return [Secret("s", np.arange(2), np.ones(2, np.float32))]

        def private_artifacts(self):
            return [Secret("a", np.arange(1), np.ones(1, np.float32))]

    inner = ComposedStrategy(
        FedAvg(MethodParams(), np.zeros(4, np.float32), 10), [Keeper(HookParams())]
    )
    s = PrivateStrategy(inner, PrivacyConfig(mode="central"), AccountedSampling(2, Schedule(10, 2)),
                        1e-3, 10)  # fmt: skip
    assert [x.name for x in s.secrets()] == ["s"]
    assert [x.name for x in s.private_artifacts()] == ["a"]
