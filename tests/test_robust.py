"""Robust aggregation and model-poisoning attacks in runs (``robust``, ``raysim.robust``,
``hooks.clients`` attacks): refusals, the rules on identical updates, the forged updates the
method receives, norm bounding on the workers, determinism across workers and a resume."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from raysim.algorithms.base import Update
from raysim.algorithms.registry import BEHAVIOURS, get_method
from raysim.config import ConfigError, load_config
from raysim.robust import rules
from raysim.robust.server import RobustStrategy, aggregate
from raysim.robust.settings import RobustConfig
from tests.conftest import EXAMPLES

QUICK = ["rounds=3", "eval.every=3", "tracking.enabled=false", "clients.per_round=10"]


def run(*overrides):
    from raysim.actors.local import local_core

    core = local_core(load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides]))
    while not core.done:
        core.step()
    return core


def refusal(*overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides])
    text = str(e.value)
    assert "\n" not in text.strip()
    return text


#: for n = 10 a round: the smallest f each rule's paper does not cover
BREAKS = {"krum": 4, "multi_krum": 4, "median": 5, "trimmed_mean": 5, "bulyan": 2,
          "geometric_median": 5, "centered_clipping": 5}  # fmt: skip


@pytest.mark.parametrize("rule", sorted(BREAKS))
def test_each_rule_refuses_an_f_its_paper_does_not_cover_in_one_line(rule):
    f = BREAKS[rule]
    text = refusal(f"robust.rule={rule}", f"robust.f={f}")
    assert f"robust.rule {rule} needs {rules.RULES[rule].assumption}" in text
    assert f"f = {f}" in text
    load_config(EXAMPLES / "quickstart.yaml", [*QUICK, f"robust.rule={rule}", f"robust.f={f - 1}"])


def test_robust_rules_and_forging_attacks_refuse_what_they_cannot_serve():
    assert "fedbuff does not average them in synchronous rounds" in refusal(
        "robust.rule=median", "algorithm.name=fedbuff"
    )
    assert "alie forges its update" in refusal(
        "algorithm.name=fedasync", "hooks.clients=[{name: alie, fraction: 0.1}]"
    )
    assert "not combined yet" in refusal("robust.rule=median", "privacy.mode=central")
    assert "clients.sampling uniform" in refusal("robust.rule=median", "clients.sampling=poisson")
    assert "updates travel whole" in refusal("robust.rule=krum", "workers.partial_sums=true")
    cfg = load_config(EXAMPLES / "quickstart.yaml", [*QUICK, "robust.rule=norm_bound"])
    assert cfg.partial_sums()  # norm bounding clips on the workers: sums stay there
    cfg = load_config(EXAMPLES / "quickstart.yaml", [*QUICK, "robust.rule=median"])
    assert not cfg.partial_sums()


@pytest.mark.parametrize("rule", [r for r in rules.RULES if r != "norm_bound"])
@pytest.mark.parametrize("n", [7, 12])
def test_without_adversaries_a_rule_on_identical_updates_is_their_mean(rule, n):
    v = np.random.default_rng(n).normal(size=30).astype(np.float32)
    v *= 5.0 / np.linalg.norm(v)  # inside centred clipping's default τ = 10
    x = np.tile(v, (n, 1))
    settings = RobustConfig(rule=rule, f=1)
    out, _ = aggregate(settings, x, np.arange(1.0, n + 1), None)
    np.testing.assert_allclose(out, x.mean(0), rtol=1e-6, atol=1e-6)


def fedavg(d: int = 6):
    method = get_method("fedavg")
    return method.strategy(method.spec.params(), np.zeros(d, dtype=np.float32), 20)


def update(client: int, delta, samples: int = 10) -> Update:
    return Update(client_id=client, delta=np.asarray(delta, dtype=np.float32),
                  num_samples=samples, dispatch_round=0, dispatch_version=0,
                  arrival_time=0.0, arrival_round=0, tau_versions=0,
                  base=np.zeros(len(delta), dtype=np.float32))  # fmt: skip


def behaviour(name: str, **params):
    b = BEHAVIOURS.get(name).build(params)
    b.setup(0, 20)
    return b


def test_forged_updates_replace_the_attackers_and_the_method_averages_them_as_sent():
    """IPM's clients (3 and 7) send −ε·(benign mean); FedAvg weighs every update by its
    samples, the forged ones included; arrival order does not matter."""
    rng = np.random.default_rng(0)
    deltas = {c: rng.normal(size=6) for c in range(10)}
    samples = {c: 5 + c for c in range(10)}
    ipm = behaviour("ipm", clients=[3, 7], epsilon=0.5)
    results = []
    for order in (range(10), reversed(range(10))):
        s = RobustStrategy(fedavg(), RobustConfig(), [ipm])
        for c in order:
            s.on_arrival(update(c, deltas[c], samples[c]))
        s.on_round_end(0)
        results.append(s.weights.copy())
        assert s.metrics()["robust_forged"] == 2
    honest = np.stack([deltas[c] for c in range(10) if c not in (3, 7)])
    forged = -0.5 * honest.mean(0)
    sent = {c: (forged if c in (3, 7) else deltas[c]) for c in range(10)}
    expected = sum(samples[c] * sent[c] for c in range(10)) / sum(samples.values())
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-6)
    assert np.array_equal(results[0], results[1])


def test_norm_bounding_clips_a_forged_update_as_the_workers_clip_the_others():
    rng = np.random.default_rng(1)
    settings = RobustConfig(rule="norm_bound", norm_bound={"max_norm": 0.5})
    s = RobustStrategy(fedavg(), settings, [behaviour("ipm", clients=[0], epsilon=50.0)])
    for c in range(5):
        s.on_arrival(update(c, 0.1 * rng.normal(size=6)))
    s.on_round_end(0)
    assert s.metrics()["robust_forged"] == 1
    assert np.linalg.norm(s.weights) <= 0.5 + 1e-6  # a mean of updates of norm <= 0.5


def test_a_forgery_that_is_not_a_finite_update_stops_in_one_line():
    from raysim.algorithms.general.attacks import IPM

    class Broken(IPM):
        def forge(self, honest, n, f):
            return np.full(honest.shape[1], np.nan)

    bad = Broken(BEHAVIOURS.get("ipm").params(clients=[0]))
    s = RobustStrategy(fedavg(), RobustConfig(), [bad])
    for c in range(3):
        s.on_arrival(update(c, np.ones(6)))
    with pytest.raises(ValueError, match="Broken.forge returned .* not 6 finite ones"):
        s.on_round_end(0)


def test_krum_gives_the_method_one_update_and_counts_the_attackers_it_picked():
    benign = [np.full(6, 1.0) + 0.01 * c for c in range(8)]
    far = [np.full(6, 50.0), np.full(6, -50.0)]
    s = RobustStrategy(fedavg(), RobustConfig(rule="krum", f=2),
                       [behaviour("scale_update", clients=[8, 9], factor=10.0)])  # fmt: skip
    for c, d in enumerate([*benign, *far]):
        s.on_arrival(update(c, d))
    s.on_round_end(0)
    chosen = rules.krum_chosen(np.stack([*benign, *far]), 2)
    np.testing.assert_array_equal(
        s.weights, np.stack([*benign, *far]).astype(np.float32)[chosen[0]]
    )
    m = s.metrics()
    assert m["robust_attackers"] == 2 and m["robust_attackers_chosen"] == 0


def test_a_round_too_small_for_the_rule_keeps_the_model_and_says_so():
    s = RobustStrategy(fedavg(), RobustConfig(rule="bulyan", f=1), [])
    for c in range(5):  # Bulyan with f = 1 needs 7
        s.on_arrival(update(c, np.ones(6)))
    assert not s.on_round_end(0) or not s.weights.any()
    assert not s.weights.any() and s.metrics()["robust_skipped"] == 1


def test_centred_clipping_starts_from_the_last_aggregate_and_resumes_with_it():
    s = RobustStrategy(fedavg(), RobustConfig(rule="centered_clipping", f=1), [])
    x = np.random.default_rng(3).normal(size=(5, 6)) * 4
    for r in range(2):
        for c in range(5):
            s.on_arrival(replace(update(c, x[c] + r), dispatch_round=r, arrival_round=r))
        s.on_round_end(r)
    first = rules.centered_clipping(x, np.zeros(6), 10.0)
    second = rules.centered_clipping(x + 1, first, 10.0)
    np.testing.assert_allclose(s.weights, first + second, rtol=1e-5, atol=1e-6)
    again = RobustStrategy(fedavg(), RobustConfig(rule="centered_clipping", f=1), [])
    again.load_state_dict(s.state_dict())
    assert np.array_equal(again.centre, s.centre)


def test_a_gaussian_attacker_draws_from_the_seed_client_and_round():
    from raysim.algorithms.base import ClientContext  # noqa: F401 - the attribute names used

    b = behaviour("gaussian_update", clients=[1], sigma=2.0)

    class Ctx:
        client_id, dispatch_round = 1, 4

    one, two = b.on_update(Ctx, np.zeros(1000)), b.on_update(Ctx, np.zeros(1000))
    assert np.array_equal(one, two) and abs(one.std() - 2.0) < 0.2
    Ctx.dispatch_round = 5
    assert not np.array_equal(one, b.on_update(Ctx, np.zeros(1000)))


def steps_of(*overrides) -> list[float]:
    """The norm of each round's change of the global model."""
    from raysim.actors.local import local_core

    core = local_core(load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides]))
    seen = [core.strategy.weights.copy()]
    while not core.done:
        core.step()
        seen.append(core.strategy.weights.copy())
    return [float(np.linalg.norm(b - a)) for a, b in zip(seen[:-1], seen[1:], strict=True)]


def test_norm_bounding_clips_each_update_on_its_worker():
    """Boosted attackers (×100) under norm_bound: every round's step is a weighted mean of
    updates of norm ≤ M, so no step exceeds M."""
    boost = "hooks.clients=[{name: scale_update, fraction: 0.3, factor: 100.0}]"
    bounded = steps_of("robust.rule=norm_bound", "robust.norm_bound.max_norm=0.5", boost)
    assert max(bounded) <= 0.5 * (1 + 1e-5) < max(steps_of(boost))


ATTACKED = [
    "robust.rule=multi_krum",
    "robust.f=2",
    "hooks.clients=[{name: alie, fraction: 0.1}, {name: gaussian_update, clients: [5, 17, 60]}]",
    "workers.group_size=2",
]


@pytest.mark.matrix  # suite time: three runs
def test_a_run_with_attacks_resumes_to_the_same_bits():
    from tests.conftest import resumed_through_checkpoint

    core = run(*ATTACKED)
    assert sum(h["robust_forged"] for h in core.history) > 0
    cfg = load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *ATTACKED])
    resumed, _ = resumed_through_checkpoint(cfg, 1)
    assert resumed.digest() == core.digest()
    assert run(*ATTACKED[:2]).digest() != core.digest()  # the attacks change the run


@pytest.mark.matrix  # suite time: two runs on a Ray pool
def test_a_run_with_attacks_gives_the_same_bits_on_1_and_2_ray_workers_and_a_kill(ray_cluster):
    """The adversaries follow from the seed and the forging reads the round's updates in
    client order: which worker trains a job changes nothing, nor does a killed worker."""
    import raysim

    ref = run(*ATTACKED)
    on_ray = [*QUICK, *ATTACKED, "runtime=ray", "workers.transport=calls"]
    kill = ["faults.kill_worker.round=1", "faults.kill_worker.worker=1"]
    for extra in (["workers.count=1"], ["workers.count=2", *kill]):
        r = raysim.run(EXAMPLES / "quickstart.yaml", [*on_ray, *extra])
        assert r.weights_digest == ref.digest()
        assert sum(h["robust_forged"] for h in r.history) > 0
    assert sum(h["worker_restarts"] for h in r.history) == 1


def test_the_plan_says_what_the_rule_and_the_forgers_do():
    from raysim.robust.settings import robust_plan_line

    def line(*over):
        return robust_plan_line(load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *over]))

    assert line() == ""
    assert "median of each round's 10 updates, tolerating f = 2" in line(
        "robust.rule=median", "robust.f=2"
    )
    assert "clipped to 0.5 on its worker" in line(
        "robust.rule=norm_bound", "robust.norm_bound.max_norm=0.5"
    )
    assert "ipm forged on the server" in line("hooks.clients=[{name: ipm, fraction: 0.1}]")


@pytest.mark.matrix  # suite time: two subprocesses that import the stack
def test_the_examples_grid_runs_a_corner_and_reports_it(tmp_path):
    """examples/robust: two rules, one ζ, both attacks, two seeds, two rounds: the scripts run,
    the report's tables, claims and plot come out (the claims not run say so)."""
    import subprocess
    import sys

    script = EXAMPLES / "robust"
    subprocess.run([sys.executable, script / "reproduce.py", "--out", tmp_path, "--rounds", "2",
                    "--seeds", "0", "1", "--rules", "none", "norm_bound", "--fractions", "0",
                    "0.1"], check=True, capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, script / "report.py", tmp_path / "results.json", "--to",
                    tmp_path], check=True, capture_output=True)  # fmt: skip
    text = (tmp_path / "RESULTS.md").read_text()
    assert "| FedAvg (mean) (0) |" in text and "| norm_bound (6) |" in text
    assert "N1 (Sun et al. 2019" in text and "| **not run** |" in text
    assert (tmp_path / "robust.png").stat().st_size > 10_000
