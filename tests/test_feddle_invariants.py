"""Feddle spec §7.2 invariants checked on whole in-process runs (no Ray): the clauses of I-2, I-3,
I-13, I-14, I-15 and I-16 that the unit tests elsewhere (tests/test_clock.py,
tests/test_algorithms.py, tests/test_feddle_baselines.py) do not assert on the coordinator itself.

Each test runs ``local_core`` on a tiny digits MLP and records what the coordinator does by
wrapping the schedule's ``dispatch`` and the strategy's ``on_arrival`` of that one core instance.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from raysim.actors.coordinator_core import TIMING_METRICS, CoordinatorCore
from raysim.actors.evaluation import evaluator_for
from raysim.actors.jobs import job_groups
from raysim.actors.local import local_core
from raysim.actors.worker import ClientRunner
from raysim.config import load_config
from raysim.data import build_federated_dataset
from raysim.sim.build import server_context

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WALL_CLOCK = TIMING_METRICS


def cfg_for(algorithm, rounds=8, num=20, per_round=5, sigma=3.0, id_size=0, seed=2, **extra):
    delays = {"kind": "half_normal", "sigma": sigma}
    return load_config(
        {
            "seed": seed,
            "rounds": rounds,
            "clients": {"num": num, "per_round": per_round},
            "data": {
                "name": "digits",
                "partition": {"kind": "dirichlet", "alpha": 0.3},
                "server": {"id_size": id_size},
            },
            "model": {"name": "mlp", "hidden": [8]},
            "local": {"epochs": 1, "batch_size": 32, "lr": 0.1},
            "algorithm": algorithm,
            "delays": delays,
            **extra,
        }
    )


def recorded(core: CoordinatorCore) -> CoordinatorCore:
    """Record every dispatch (``core.dispatches``) and every update the strategy receives
    (``core.updates``), with the model version after each round (``core.versions``)."""
    core.dispatches, core.updates, core.versions = [], [], []
    dispatch, on_arrival = core.schedule.dispatch, core.strategy.on_arrival

    def record_dispatch(k):
        d = dispatch(k)
        core.dispatches.append(d)
        return d

    def record_arrival(update):
        core.updates.append(update)
        return on_arrival(update)

    core.schedule.dispatch = record_dispatch
    core.strategy.on_arrival = record_arrival
    return core


def run_recorded(cfg, *, evaluate=False):
    core = recorded(local_core(cfg, evaluate=evaluate))
    while not core.done:
        core.step()
        core.versions.append(core.version)
    return core


def jobs(core):
    """Every dispatched job as (dispatch round, client, delay, delivery round ⌊k + d⌋)."""
    return [
        (d.round, c, dl, math.floor(d.round + dl))
        for d in core.dispatches
        for c, dl in zip(d.clients.tolist(), d.delays.tolist(), strict=True)
    ]


def deterministic(history):
    """A comparable text of a metric log without its wall-clock keys (repr: NaN equals NaN)."""
    return repr([{k: v for k, v in h.items() if k not in WALL_CLOCK} for h in history])


# --------------------------------------------------------------------------- I-1, I-2
@pytest.mark.parametrize("sigma", [0.0, 3.0])
def test_every_dispatched_job_is_delivered_once_in_its_round_iff_before_the_end(sigma):
    """I-2 on the coordinator (tests/test_clock.py checks the bare ``Schedule``): each round
    dispatches min(S, #idle) distinct idle clients, a client reporting in round r is not
    dispatched again before r+1, and every job reaches the strategy exactly once, in round
    ⌊k + d⌋, iff that round is < R (the others count as dropped late). I-1: σ = 0 ⇒ every
    update is delivered in its dispatch round."""
    J, S, R = 12, 5, 10
    core = run_recorded(cfg_for({"name": "fedavg"}, rounds=R, num=J, per_round=S, sigma=sigma))
    assert [d.round for d in core.dispatches] == list(range(R))
    in_flight: set[int] = set()
    delivered_by_round = Counter(u.arrival_round for u in core.updates)
    reported_in: dict[int, int] = {}  # client → round of its last report
    for d in core.dispatches:
        k, clients = d.round, d.clients.tolist()
        for u in core.updates:  # reports of round k-1 free their clients for round k
            if u.arrival_round == k - 1:
                in_flight.discard(u.client_id)
                reported_in[u.client_id] = k - 1
        idle = J - len(in_flight)
        assert len(clients) == min(S, idle) and len(set(clients)) == len(clients)
        assert not in_flight & set(clients), f"round {k}: a client in flight was dispatched"
        assert all(reported_in.get(c, -1) < k for c in clients)
        in_flight |= set(clients)
    want = Counter((k, c, r) for k, c, _, r in jobs(core) if r < R)
    got = Counter((u.dispatch_round, u.client_id, u.arrival_round) for u in core.updates)
    assert got == want  # exactly once, in round ⌊k + d⌋, and only if ⌊k + d⌋ < R
    late = [j for j in jobs(core) if j[3] >= R]
    assert sum(s.dropped_late for s in core.stats.values()) == len(late)
    assert [h["clients_arrived"] for h in core.history] == [delivered_by_round[k] for k in range(R)]
    if sigma == 0:
        assert all(u.arrival_round == u.dispatch_round for u in core.updates)
        assert len(core.updates) == R * S and not late
    else:  # not vacuous: idle clients ran short, and some jobs were dropped late
        assert any(len(d) < S for d in core.dispatches) and late


# --------------------------------------------------------------------------- I-3
ROUND_SYNCHRONOUS = [
    pytest.param({"name": "fedavg"}, 0, id="fedavg"),
    pytest.param({"name": "fedprox", "mu": 0.1}, 0, id="fedprox"),
    pytest.param({"name": "fedadam"}, 0, id="fedadam"),
    pytest.param({"name": "fedbuff_per_round"}, 0, id="fedbuff_per_round"),
    pytest.param({"name": "fedft", "server_epochs": 1}, 40, id="fedft"),
    pytest.param({"name": "hfcl"}, 40, id="hfcl"),
    pytest.param({"name": "feddf", "server_epochs": 1}, 40, id="feddf"),
    pytest.param({"name": "feddle", "server_epochs": 1}, 40, id="feddle"),
]


@pytest.mark.parametrize("algorithm, id_size", ROUND_SYNCHRONOUS)
def test_round_synchronous_staleness_is_the_floor_of_the_delay(algorithm, id_size):
    """I-3: for round-synchronous methods tau_versions == tau_rounds == ⌊d⌋ ≥ 0 for every
    update, and the version moves once per round (§2.4), also in the first three rounds, in
    which nothing arrives (σ = 20)."""
    R = 8
    cfg = cfg_for(algorithm, rounds=R, sigma=20.0, id_size=id_size, seed=4)
    core = run_recorded(cfg)
    delay = {(k, c): dl for k, c, dl, _ in jobs(core)}
    assert [h["clients_arrived"] for h in core.history[:3]] == [0, 0, 0]  # seed 4: nothing yet
    assert any(u.tau_rounds > 0 for u in core.updates)  # some are stale
    for u in core.updates:
        d = delay[(u.dispatch_round, u.client_id)]
        assert u.tau_rounds == math.floor(d) >= 0
        assert u.tau_versions == u.tau_rounds, (u.client_id, u.dispatch_round, u.arrival_round)
    assert core.versions == list(range(1, R + 1))


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "fedasync"},
        {"name": "fedbuff", "buffer_size": 3},
        {"name": "ca2fl", "buffer_size": 3},
    ],
    ids=lambda a: a["name"],
)
def test_asynchronous_staleness_is_never_negative(algorithm):
    """I-3 ``tau ≥ 0 always``, for the per-arrival and count-triggered servers too, whose
    tau_versions counts versions (flushes, arrivals) rather than rounds."""
    core = run_recorded(cfg_for(algorithm, rounds=8, sigma=3.0))
    assert core.updates
    for u in core.updates:
        assert u.tau_rounds >= 0 and u.tau_versions >= 0
    if algorithm["name"] == "fedasync":  # one version per arrival: never fewer than rounds
        assert any(u.tau_versions > u.tau_rounds for u in core.updates)


# --------------------------------------------------------------------------- I-13
SCHEDULE_METHODS = [
    ({"name": "fedavg"}, 0),
    ({"name": "fedasync", "mixing": 0.5}, 0),
    ({"name": "fedbuff", "buffer_size": 2}, 0),
    ({"name": "ca2fl", "buffer_size": 3}, 0),
    ({"name": "fedadam"}, 0),
    ({"name": "feddle", "server_epochs": 1}, 40),
]


def test_every_method_sees_the_same_dispatches_delays_and_deliveries():
    """I-13: for a fixed seed every method sees the same dispatch rounds, clients, delays and
    delivery rounds (exact per-job values, not just counts), though their models differ; the
    Center run touches no clients (it never even advances the schedule or runs a client job)."""
    seen, digests = [], set()
    for algorithm, id_size in SCHEDULE_METHODS:
        core = run_recorded(cfg_for(algorithm, rounds=6, sigma=3.0, id_size=id_size))
        deliveries = [
            (u.dispatch_round, u.client_id, u.arrival_round, u.arrival_time) for u in core.updates
        ]
        seen.append((jobs(core), deliveries))
        digests.add(core.digest())
    assert all(s == seen[0] for s in seen[1:])
    assert seen[0][1] and len(digests) == len(SCHEDULE_METHODS)
    center = run_recorded(cfg_for({"name": "center", "server_epochs": 1}, rounds=3, id_size=40))
    assert center.dispatches == [] and center.updates == []
    assert center.schedule.next_round == 0 and len(center.queue) == 0
    assert center.executor.runner.jobs_run == 0 and not center.stats


# --------------------------------------------------------------------------- I-14
def test_fedasync_with_alpha_one_takes_each_rounds_local_model():
    """I-14 first half, on a whole run: a = 0, α = 1, one client per round, σ = 0 ⇒ after every
    round the global model is the local model of the client that reported in it."""
    algo = {"name": "fedasync", "mixing": 1.0, "a": 0.0, "staleness": "polynomial"}
    core = recorded(local_core(cfg_for(algo, rounds=5, per_round=1, sigma=0.0)))
    prev = core.weights.copy()
    for k in range(5):
        core.step()
        assert len(core.updates) == k + 1  # one arrival per round
        u = core.updates[-1]
        assert u.arrival_round == k and u.tau_versions == 0
        np.testing.assert_array_equal(core.weights, u.local_weights)
        np.testing.assert_array_equal(u.base, prev)  # it trained on the previous global model
        assert not np.array_equal(core.weights, prev)
        prev = core.weights.copy()


# --------------------------------------------------------------------------- I-15
def test_feddle_mini_evaluates_at_rounds_10_to_200_and_reports_the_max_of_the_last_five():
    """I-15 with the protocol of examples/feddle/mini.yaml (R = 200, eval every 10, window 5):
    evaluations after rounds 10, 20, …, 200 (round indices 9, …, 199) and nowhere else, and the
    reported number (``accuracy_max_last``) is the max of the last five. Center (no clients,
    trained once) keeps 200 rounds cheap; the evaluator's accuracies are replaced by a sequence
    whose max over the last five differs from the last value, the overall max and the max of any
    other window, so that the window length is pinned."""
    cfg = load_config(EXAMPLES / "feddle" / "mini.yaml")
    assert (cfg.rounds, cfg.eval.every, cfg.eval.final_window) == (200, 10, 5)
    raw = cfg.model_dump(mode="json")
    raw["algorithm"] = {"name": "center", "server_epochs": 1}
    raw["data"]["server"]["ood"] = []
    raw["tracking"] = {"enabled": False}
    core = local_core(load_config(raw), evaluate=True)
    real = core.evaluator
    accuracy = {
        9 + 10 * i: a for i, a in enumerate([0.99, *[0.1] * 12, 0.3, 0.9, 0.8, 0.2, 0.5, 0.6, 0.4])
    }
    calls = []

    def evaluator(weights, states, final, k):
        calls.append((k, final))
        metrics = real(weights, states, final, k)
        assert 0 <= metrics["accuracy"] <= 1
        return {**metrics, "accuracy": accuracy[k]}

    core.evaluator = evaluator
    while not core.done:
        core.step()
    rounds = [int(e["round"]) for e in core.evaluations]
    assert rounds == list(range(10, 201, 10))
    assert calls == [(k, k == 199) for k in range(9, 200, 10)]
    assert [int(h["round"]) for h in core.history if "accuracy" in h] == list(range(10, 201, 10))
    reported = core.final_metrics()["accuracy_max_last"]
    assert reported == max(e["accuracy"] for e in core.evaluations[-5:]) == 0.8
    assert reported not in (core.evaluations[-1]["accuracy"], 0.99)  # not last, not overall max


# --------------------------------------------------------------------------- I-16
class RoundRobinExecutor:
    """An in-process stand-in for a pool of ``n`` workers: each group of jobs that trains
    together (``job_groups``, as the Ray pool cuts them; one job each under sequential execution)
    runs on the next runner in turn as soon as it is submitted, the groups of a batch in reverse
    order (as if they finished out of order), and evaluations alternate between runners."""

    def __init__(self, runners):
        self.runners, self.results, self.evals, self.sent = runners, {}, 0, 0
        self.group_size = runners[0].group_size

    def put(self, weights):
        return weights

    def get(self, handle):
        return handle

    def submit(self, handle, jobs):
        for group in reversed(job_groups(jobs, self.group_size)):
            runner = self.runners[self.sent % len(self.runners)]
            self.sent += 1
            for result in runner.run_batch(handle, group):
                self.results[result.job_id] = result

    def result(self, job_id):
        return self.results.pop(job_id)

    def evaluate(self, handle, jobs):
        self.evals += 1
        results = self.runners[self.evals % len(self.runners)].evaluate_batch(handle, jobs)
        return lambda: results

    def events(self):
        return []

    def sum_counts(self):
        return 0, {}

    def kill_worker(self, index):
        pass

    def describe(self):
        return []

    def close(self):
        pass


def pooled_core(cfg, workers):
    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    runners = [ClientRunner(cfg, ds) for _ in range(workers)]
    executor = RoundRobinExecutor(runners)
    initial, layout = runners[0].initial_global()
    return CoordinatorCore(
        cfg,
        initial,
        ds.client_sizes(),
        executor,
        evaluator_for(cfg, ds, executor),
        server=server_context(cfg, ds, layout),
    )


I16_METHODS = [
    pytest.param({"name": "fedbuff", "buffer_size": 3}, 0, id="fedbuff"),
    pytest.param({"name": "fedasync", "mixing": 0.5}, 0, id="fedasync"),
    pytest.param({"name": "feddle", "server_epochs": 1}, 40, id="feddle"),
]


@pytest.mark.parametrize("algorithm, id_size", I16_METHODS)
def test_same_seed_gives_bit_identical_metric_logs_whatever_the_workers(algorithm, id_size):
    """I-16 in-process: two runs with the same seed and config log bit-identical metrics every
    round (wall-clock keys aside) and evaluations, and so does the same run with its client jobs
    spread over 3 runners that finish them out of order (the Ray form, with 1 and 3 real workers,
    is tests/test_runtime.py::test_same_result_with_one_or_three_workers)."""
    cfg = cfg_for(algorithm, rounds=5, sigma=2.0, id_size=id_size)
    runs = [local_core(cfg, evaluate=True) for _ in range(2)] + [pooled_core(cfg, 3)]
    for core in runs:
        while not core.done:
            core.step()
    logs = [deterministic(c.history) for c in runs]
    assert logs[0] == logs[1] == logs[2]
    assert repr(runs[0].evaluations) == repr(runs[1].evaluations) == repr(runs[2].evaluations)
    assert len({c.digest() for c in runs}) == 1
    assert all(r.jobs_run for r in runs[2].executor.runners)  # the 3 runners all worked
    assert "accuracy" in runs[0].history[-1] and sum(h["clients_arrived"] for h in runs[0].history)
    other = local_core(cfg_for(algorithm, rounds=5, sigma=2.0, id_size=id_size, seed=3))
    while not other.done:
        other.step()
    assert other.digest() != runs[0].digest()  # the comparison above is not vacuous
