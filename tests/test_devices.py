"""Clients as devices (raysim.devices): traces in FedScale's format and raysim's own, sampling
that respects availability, partial work, deadline rounds, over-commitment, and runs with them
that are deterministic."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from raysim.config import ConfigError, load_config
from raysim.devices.clock import CLOSED, LEFT, STRAGGLER, DeviceSchedule, Work
from raysim.devices.fedscale import read_fedscale
from raysim.devices.synthetic import DAY_S, synthetic_traces
from raysim.devices.traces import DeviceTraces, TraceError, read_traces, write_traces
from tests.conftest import EXAMPLES

QUICK = ["rounds=4", "eval.every=4", "tracking.enabled=false", "devices.enabled=true"]


def fedscale_files(traces: DeviceTraces, folder) -> tuple:
    """``traces`` written as FedScale's two pickled dicts, keyed from 1 as FedScale's are."""
    cap = {
        i + 1: {"computation": float(c), "communication": float(b)}
        for i, (c, b) in enumerate(zip(traces.compute_ms, traces.bandwidth_kbps, strict=True))
    }
    behave = {}
    for i in range(traces.size):
        lo, hi = traces.offsets[i], traces.offsets[i + 1]
        behave[i + 1] = {
            "active": traces.starts[lo:hi].tolist(),
            "inactive": traces.ends[lo:hi].tolist(),
            "finish_time": float(traces.period_s[i]),
            "duration": float(traces.period_s[i]),
            "model": "synthetic",
        }
    paths = folder / "client_device_capacity", folder / "client_behave_trace"
    for path, obj in zip(paths, (cap, behave), strict=True):
        path.write_bytes(pickle.dumps(obj))
    return paths


def schedule(traces: DeviceTraces, n: int = 400, per_round: int = 20, **kw) -> DeviceSchedule:
    work = Work(np.full(n, 30, np.int64), batch_size=10, model_bytes=40_000)
    kw.setdefault("deadline_s", 600.0)
    return DeviceSchedule(traces, work, per_round, seed=3, **kw)


def dispatches(s: DeviceSchedule, rounds: int) -> list:
    return [s.dispatch(k) for k in range(rounds)]


# ----------------------------------------------------------------- traces
def test_availability_follows_the_windows_and_wraps_at_the_period():
    traces = DeviceTraces(
        np.ones(2), np.ones(2), np.array([100.0, 100.0]), np.array([0, 2, 2]),
        np.array([0.0, 80.0]), np.array([10.0, 100.0]),
    )  # fmt: skip
    ok, until = traces.availability(np.array([0, 0, 0, 1, 2]), 85.0)
    # device 0: [0, 10] and [80, 100], which runs into [0, 10] of the next period
    assert ok.tolist() == [True, True, True, False, True]
    assert until[0] == 100.0 + 10.0
    ok, _ = traces.availability(np.array([0]), 150.0)  # 50 into the second period
    assert not ok[0]
    assert traces.fraction_available() == pytest.approx(0.3 / 2)


@pytest.mark.parametrize("per_device", [3, 40])  # a scan of a device's windows; a search
def test_availability_equals_a_brute_force_check(per_device):
    from raysim.devices.traces import windows

    rng = np.random.default_rng(per_device)
    n, period = 50, 1000.0
    owner = np.repeat(np.arange(n), per_device)
    starts = rng.uniform(0, period, owner.size)
    ends = np.minimum(starts + rng.exponential(10.0, owner.size), period)
    traces = DeviceTraces(
        np.ones(n), np.ones(n), np.full(n, period), *windows(n, owner, starts, ends)
    )
    clients = rng.integers(0, 3 * n, 400)
    for t in rng.uniform(0, 3 * period, 20):
        ok, _ = traces.availability(clients, t)
        local = t % period
        e = clients % n
        brute = [bool(np.any((owner == d) & (starts <= local) & (local <= ends))) for d in e]
        assert ok.tolist() == brute


def test_overlapping_windows_are_merged_when_read(tmp_path):
    (tmp_path / "capacity.csv").write_text(
        "client,compute_ms,bandwidth_kbps,period_s\n0,5,100,50\n"
    )
    (tmp_path / "availability.csv").write_text("client,start_s,end_s\n0,20,30\n0,0,10\n0,5,25\n")
    t = read_traces(tmp_path)
    assert (t.starts.tolist(), t.ends.tolist()) == ([0.0], [30.0])
    assert t.availability(np.array([0]), 27.0)[0][0]


def test_fedscale_and_our_own_format_give_the_same_schedule(tmp_path):
    made = synthetic_traces(300, seed=1)
    capacity, behave = fedscale_files(made, tmp_path)
    theirs = read_fedscale(capacity, behave)
    write_traces(made, tmp_path / "csv")
    write_traces(made, tmp_path / "parquet", fmt="parquet")
    ours = [read_traces(tmp_path / "csv"), read_traces(tmp_path / "parquet")]
    runs = [dispatches(schedule(t, n=900), 30) for t in (made, theirs, *ours)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert np.array_equal(a.clients, b.clients)
            assert np.array_equal(a.lost, b.lost) and np.allclose(a.seconds, b.seconds)
    assert sum(len(d) for d in runs[0]) > 0


def test_a_pickle_that_names_code_is_refused_before_it_runs(tmp_path):
    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    bad = tmp_path / "client_device_capacity"
    bad.write_bytes(pickle.dumps({1: Boom()}))
    with pytest.raises(TraceError, match="names builtins.print"):
        read_fedscale(bad)
    (tmp_path / "empty").write_bytes(pickle.dumps([]))
    with pytest.raises(TraceError, match="non-empty dict"):
        read_fedscale(tmp_path / "empty")


def test_bad_trace_files_are_refused_in_one_line(tmp_path):
    with pytest.raises(TraceError, match="no capacity.csv"):
        read_traces(tmp_path)
    (tmp_path / "capacity.csv").write_text("client,compute_ms\n0,5\n")
    with pytest.raises(TraceError, match="missing column"):
        read_traces(tmp_path)
    (tmp_path / "capacity.csv").write_text("client,compute_ms,bandwidth_kbps\n1,5,100\n")
    with pytest.raises(TraceError, match="0..n-1"):
        read_traces(tmp_path)
    (tmp_path / "capacity.csv").write_text("client,compute_ms,bandwidth_kbps\n0,-5,100\n")
    with pytest.raises(TraceError, match="compute_ms"):
        read_traces(tmp_path)


def test_synthetic_traces_are_seeded_and_diurnal():
    a, b = synthetic_traces(5000, seed=0), synthetic_traces(5000, seed=0)
    assert np.array_equal(a.starts, b.starts) and np.array_equal(a.compute_ms, b.compute_ms)
    ids = np.arange(5000)
    night = a.availability(ids, 2 * 3600.0)[0].mean()
    noon = a.availability(ids, 13 * 3600.0)[0].mean()
    assert night > 0.6 and noon < 0.15  # devices charge at night
    assert 0.2 < a.fraction_available() < 0.45
    # FedScale's spread of speeds: log-normal with σ = 0.6
    assert np.std(np.log(a.compute_ms)) == pytest.approx(0.6, rel=0.05)
    assert a.period_s[0] == DAY_S


# ----------------------------------------------------------------- the clock
def test_a_client_is_never_sampled_outside_its_availability():
    traces = synthetic_traces(2000, seed=4)
    s = schedule(traces, n=2000, per_round=150, deadline_s=1800.0)
    sampled = 0
    for d in dispatches(s, 48):  # a day of half-hour rounds
        assert traces.availability(d.clients, d.start)[0].all()
        sampled += len(d)
        # a job that outlasts its device's window is lost, none other
        _, until = traces.availability(d.clients, d.start)
        assert ((d.lost == LEFT) == ((d.lost != STRAGGLER) & (d.start + d.seconds > until))).all()
    # by day few devices are available (about 5 %): fewer than 150 a round were found then
    assert sampled < 48 * 150


def test_partial_work_is_exactly_the_steps_the_deadline_allows():
    n = 10
    traces = DeviceTraces(np.full(n, 20.0), np.full(n, 800.0))  # always available
    # a step: 3 · 10 samples · 20 ms = 0.6 s; up and down: 2 · 40 kB · 8 / 800 kbit/s = 0.8 s
    s = schedule(traces, n=n, per_round=n, deadline_s=10.0, partial=True)
    d = s.dispatch(0)
    assert (d.max_steps == math.floor((10.0 - 0.8) / 0.6)).all()  # 15 of its 30 steps
    assert np.allclose(d.seconds, 0.8 + 15 * 0.6) and not d.lost.any()
    dropped = schedule(traces, n=n, per_round=n, deadline_s=10.0, partial=False).dispatch(0)
    assert (dropped.lost == STRAGGLER).all()
    short = schedule(traces, n=n, per_round=n, deadline_s=1.0, partial=True).dispatch(0)
    assert (short.lost == STRAGGLER).all()  # not even one step fits


def test_fedprox_stragglers_do_a_random_part_of_their_epochs_or_are_dropped():
    traces = DeviceTraces(np.full(40, 1e-6), np.full(40, 1e9))  # fast: only the draw cuts work
    work = Work(np.full(40, 60, np.int64), batch_size=10, model_bytes=100, epochs=20)
    for partial in (True, False):
        s = DeviceSchedule(traces, work, 10, seed=1, deadline_s=1e9, partial=partial,
                           stragglers=0.9)  # fmt: skip
        for k in range(20):
            d = s.dispatch(k)
            assert s.last["devices_stragglers"] == 10 - round(10 * 0.1)
            if partial:  # x of E = 20 epochs, x in 1..19: 3·x of the 60 steps
                cut = d.max_steps[d.max_steps >= 0]
                assert len(cut) == 9 and not d.lost.any()
                assert (cut % 3 == 0).all() and cut.min() >= 3 and cut.max() <= 57
            else:
                assert (d.lost == STRAGGLER).sum() == 9 and (d.max_steps < 0).all()


def test_a_round_closes_with_the_first_k_to_report_and_overcommits():
    traces = synthetic_traces(500, seed=2, always_available=1.0)
    s = schedule(traces, n=500, per_round=20, overcommit=1.3, close_after=20, deadline_s=1e6)
    d = s.dispatch(0)
    assert len(d) == 26  # ceil(1.3 · 20)
    kept = d.lost == 0
    assert kept.sum() == 20 and (d.lost[~kept] == CLOSED).all()
    assert d.seconds[kept].max() <= d.seconds[~kept].min()  # the 20 fastest
    assert d.end - d.start == pytest.approx(d.seconds[kept].max())
    assert s.dispatch(1).start == d.end  # the next round starts when this one closed


def test_late_updates_arrive_in_the_round_their_completion_falls_in():
    traces = synthetic_traces(200, seed=5, always_available=1.0)
    s = schedule(traces, n=200, per_round=20, late="deliver", deadline_s=60.0)
    d = s.dispatch(0)
    assert not d.lost.any()
    assert np.array_equal(d.arrival_rounds, np.floor(d.seconds / 60.0).astype(int))
    assert d.arrival_rounds.max() > 0  # some arrive in a later round


def test_the_schedule_resumes_from_its_state():
    traces = synthetic_traces(600, seed=6)
    whole = dispatches(schedule(traces, n=600, partial=True), 12)
    first = schedule(traces, n=600, partial=True)
    dispatches(first, 5)
    second = schedule(traces, n=600, partial=True)
    second.load_state_dict(first.state_dict())
    rest = [second.dispatch(k) for k in range(5, 12)]
    for a, b in zip(whole[5:], rest, strict=True):
        assert np.array_equal(a.clients, b.clients) and a.start == b.start


# ----------------------------------------------------------------- runs
def test_config_refuses_devices_beside_delays_or_poisson_sampling():
    for extra, cause in (
        (["delays.kind=half_normal"], "delays.kind none"),
        (["clients.sampling=poisson"], "sampling uniform"),
        (["algorithm.name=fedbuff", "devices.overcommit=1.3"], "devices.late drop"),
        (["devices.traces=files"], "devices.path"),
    ):
        with pytest.raises(ConfigError, match=cause):
            load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *extra])


def run(*overrides):
    from raysim.actors.local import local_core

    core = local_core(load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *overrides]))
    while not core.done:
        core.step()
    return core


@pytest.mark.slow
def test_a_run_with_devices_does_partial_work_and_resumes_to_the_same_bits():
    from tests.conftest import resumed_through_checkpoint

    # FedProx accepts partial work: a 60-second deadline cuts most clients' 5 epochs short
    over = ["algorithm.name=fedprox", "devices.deadline_s=60", "devices.start_s=7200",
            "devices.synthetic.always_available=0.5"]  # fmt: skip
    core = run(*over)
    m = core.history
    assert sum(h["devices_partial"] for h in m) > 0
    assert all(h["clients_arrived"] == h["devices_sampled"] - h["devices_left"] for h in m)
    again = run(*over)
    assert again.digest() == core.digest()
    cfg = load_config(EXAMPLES / "quickstart.yaml", [*QUICK, *over])
    resumed, _ = resumed_through_checkpoint(cfg, 2)
    assert resumed.digest() == core.digest()
    dropping = run(*over[1:], "algorithm.name=fedavg")  # FedAvg drops its stragglers
    assert sum(h["devices_stragglers_dropped"] for h in dropping.history) > 0
    assert sum(h["devices_partial"] for h in dropping.history) == 0


@pytest.mark.matrix  # suite time: two runs on a Ray pool
def test_a_run_with_devices_gives_the_same_bits_on_1_and_2_ray_workers_and_a_kill(ray_cluster):
    """The device clock is the coordinator's: which worker trains a job, and how jobs are
    grouped, change nothing; partial work travels with the job, and with it when a killed
    worker's jobs are sent again."""
    import raysim

    over = ["algorithm.name=fedprox", "devices.deadline_s=60", "devices.start_s=7200",
            "devices.synthetic.always_available=0.5",
            "workers.group_size=2"]  # groups of two: every worker has jobs to lose  # fmt: skip
    ref = run(*over)
    on_ray = [*QUICK, *over, "runtime=ray", "workers.transport=calls"]
    kill = ["faults.kill_worker.round=1", "faults.kill_worker.worker=1"]
    for extra in (["workers.count=1"], ["workers.count=2", *kill]):
        r = raysim.run(EXAMPLES / "quickstart.yaml", [*on_ray, *extra])
        assert r.weights_digest == ref.digest()  # a killed worker's jobs keep their caps
        assert sum(h["devices_partial"] for h in r.history) > 0
    assert sum(h["worker_restarts"] for h in r.history) == 1


def test_the_plan_says_what_the_devices_do():
    from raysim.devices.build import plan_line

    base = EXAMPLES / "fedprox" / "systems.yaml"
    prox = plan_line(load_config(base))
    assert "50% stragglers" in prox and "partial work accepted" in prox
    avg = plan_line(load_config(base, ["algorithm={name: fedavg}"]))
    assert "partial work dropped" in avg
    buff = plan_line(load_config(base, ["algorithm={name: fedbuff}", "devices.stragglers=0"]))
    assert "late updates delivered" in buff


def test_raysim_traces_converts_fedscales_files_to_ours(tmp_path, capsys):
    from raysim.cli import main

    made = synthetic_traces(200, seed=7)
    capacity, behave = fedscale_files(made, tmp_path)
    out = tmp_path / "ours"
    code = main(["traces", "--fedscale", str(capacity), "--availability", str(behave),
                 "--out", str(out), "--format", "parquet"])  # fmt: skip
    assert code == 0 and "wrote 200 devices" in capsys.readouterr().out
    back = read_traces(out)
    assert np.array_equal(back.starts, made.starts) and np.allclose(
        back.compute_ms, made.compute_ms
    )
    assert main(["traces", "--folder", str(tmp_path / "none")]) == 2
