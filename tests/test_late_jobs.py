"""``workers.late_jobs: together`` (issue 44): with delays, a job that arrives in a later round
waits until a waiting job is due; then the waiting jobs train, earliest arrival first, in as many
full groups as the due ones need, each from the version it was dispatched on. Groups then grow
with the delays instead of shrinking to a round's few arrivals, and they follow from the schedule
alone: the same weights on 1 and 3 workers, through a killed worker, and after a resume from a
checkpoint taken while jobs were waiting and in training."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.actors.jobs import job_groups
from raysim.actors.local import local_core
from raysim.config import load_config
from raysim.sim.clock import Schedule
from raysim.sim.delays import build_delay_model
from raysim.state import checkpoint
from tests.conftest import EXAMPLES

#: the quickstart, asynchronous (half-normal delays, σ = 20 rounds), batched in groups of 8
LATE = ["rounds=30", "eval.every=10", "local.epochs=1", "delays={kind: half_normal, sigma: 20}",
        "workers.execution=batched", "workers.group_size=8", "tracking.enabled=false"]  # fmt: skip


def late(*overrides):
    return load_config(EXAMPLES / "quickstart.yaml", [*LATE, *overrides])


def spied(cfg):
    """A core whose submissions are recorded: (round, [(job id, dispatch round)])."""
    core = local_core(cfg)
    sent, submit = [], core.executor.submit

    def record(handle, jobs):
        sent.append((core.round, [(j.job_id, j.dispatch_round) for j in jobs]))
        submit(handle, jobs)

    core.executor.submit = record
    return core, sent


def to_end(core):
    while not core.done:
        core.step()
    return core


def arrivals(cfg) -> dict[int, int]:
    """Each job's arrival round, by job id, from the run's schedule replayed."""
    delays = build_delay_model(cfg.delays, cfg.clients.num, cfg.seed)
    schedule = Schedule(cfg.clients.num, cfg.clients.per_round, delays, cfg.seed)
    rounds = [r for k in range(cfg.rounds) for r in schedule.dispatch(k).arrival_rounds.tolist()]
    return dict(enumerate(rounds, start=1))


def test_waiting_jobs_train_together_when_the_first_is_due():
    together, sent = spied(late())
    to_end(together)
    arrival = arrivals(late())
    at_dispatch, sent_at_dispatch = spied(late("workers.late_jobs=at_dispatch"))
    to_end(at_dispatch)
    ids = [i for _, jobs in sent for i, _ in jobs]
    assert sorted(ids) == sorted(i for _, jobs in sent_at_dispatch for i, _ in jobs)
    assert len(ids) == len(set(ids))  # each job sent once
    dispatched = {i: r for _, jobs in sent for i, r in jobs}
    gone: set[int] = set()
    held = 0  # submissions that left jobs waiting rather than send a group short
    for k, jobs in sent:
        assert all(r <= k for _, r in jobs)  # dispatched by then
        assert min(arrival[i] for i, _ in jobs) == k  # sent in the round the first is due
        gone |= {i for i, _ in jobs}
        left = [i for i, r in dispatched.items() if r <= k and i not in gone]
        assert all(arrival[i] > k for i in left)  # every job due by now went
        if left:  # full groups only, and none left waiting is due before a sent one
            held += 1
            assert len(jobs) % 8 == 0
            assert min(arrival[i] for i in left) >= max(arrival[i] for i, _ in jobs)
    assert any(len({r for _, r in jobs}) > 1 for _, jobs in sent)  # across dispatch rounds
    assert all(len({r for _, r in jobs}) == 1 for _, jobs in sent_at_dispatch)
    assert held  # (sending every waiting job, cut into groups, never does)
    sizes = [len(g) for g in groups(sent)]
    assert np.mean(sizes) > 1.4 * np.mean([len(g) for g in groups(sent_at_dispatch)])
    assert min(sizes) >= 2
    # the same training, cut into other groups: equal up to float reassociation
    assert np.abs(together.weights - at_dispatch.weights).max() < 1e-4


def groups(sent, size=8) -> set[frozenset[int]]:
    """The groups that trained together: each submission cut as ``job_groups`` cuts it."""
    return {frozenset(i for i, _ in g) for _, jobs in sent for g in job_groups(jobs, size)}


def test_a_resume_with_jobs_waiting_and_sent_ends_on_the_same_weights():
    """Cut where some jobs wait and others were sent and have not arrived: the resumed core
    trains every job in a group of the uninterrupted run (those sent before the cut again in
    theirs, mates included), and ends on its weights."""
    cfg = late()
    reference, sent = spied(cfg)
    reference = to_end(reference)
    first = local_core(cfg)
    cut = None
    while cut is None:
        first.step()
        waiting = {job.job_id for job, _, _ in first._waiting}
        in_flight = {j.job_id for j in first.queue.jobs() if j.arrival_round < cfg.rounds}
        if waiting and in_flight - waiting:  # some wait, some were sent and have not arrived
            cut = checkpoint.pack({"core": first.state_dict()}, cfg, first.round)
    resumed, sent_again = spied(cfg)
    resumed.load_state_dict(checkpoint.unpack(cut)[1]["core"])
    again = len(sent_again)  # sent before the cut, sent again
    assert again and groups(sent_again) <= groups(sent)
    to_end(resumed)
    assert sent_again[again:] == [s for s in sent if s[0] >= first.round]
    assert resumed.digest() == reference.digest() != ""


@pytest.mark.matrix  # suite time (~22 s on 2 vCPUs): the fast suite's budget
@pytest.mark.slow
def test_three_ray_workers_and_a_killed_one_give_the_one_worker_weights(ray_cluster):
    """Jobs on several versions go to Ray workers as one list of version refs per batch,
    through links and plain calls alike; a killed worker's batch runs again in its group.
    Round 13 sends one group of 8 (every submission of this run is one group, so it goes to
    the first idle worker, worker 0), which is killed right after the send."""
    import raysim

    cfg = late()
    reference = to_end(local_core(cfg)).digest()  # one worker, in this process
    kill = ["workers.count=3", "workers.num_cpus=0.5"]
    three = raysim.run(cfg, [*kill, "faults.kill_worker.round=13", "faults.kill_worker.worker=0"])
    assert sum(h["worker_restarts"] for h in three.history) == 1
    assert three.weights_digest == reference
