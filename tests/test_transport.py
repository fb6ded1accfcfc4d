"""Workers reached through Ray Compiled Graphs (``workers.transport: auto``) give the runs that
plain actor calls give (``calls``), bit for bit, on every path a batch can take: training and
evaluation, results kept for later rounds (async), more batches in flight than a link holds,
personal client state, and a worker killed while its link is up."""

from __future__ import annotations

import time

import pytest
import ray

import raysim
from raysim.config import load_config
from tests.conftest import tiny

pytestmark = pytest.mark.slow


def _run(
    cfg: dict, transport: str, overrides: list[str] = (), linked: bool | None = None
) -> tuple[object, list, dict]:
    """The run in this process's coordinator, its links up before the first round (``linked``:
    whether they come up; by default, where ``transport`` is ``auto``)."""
    session = raysim.RunSession(
        load_config(cfg, [f"workers.transport={transport}", *overrides]), coordinator_here=True
    )
    try:
        pool = session.here.pool
        assert pool.wait_for_links() == (transport == "auto" if linked is None else linked)
        metrics = list(session.rounds())
        result = session.finish()
        return result, metrics, dict(pool.sent)
    finally:
        session.close()


def _same(a: tuple, b: tuple) -> None:
    (ra, ma, _), (rb, mb, _) = a, b
    assert ra.weights_digest == rb.weights_digest
    keys = ("accuracy", "train_loss", "clients_arrived")
    assert [[m.get(k) for k in keys] for m in ma] == [[m.get(k) for k in keys] for m in mb]


CASES = {
    "sync, 2 workers": tiny(rounds=4, workers={"count": 2, "num_cpus": 0.5}),
    "async, results kept for later rounds": tiny(
        rounds=5,
        algorithm={"name": "fedbuff", "buffer_size": 3},
        delays={"kind": "half_normal", "sigma": 3.0},
        workers={"count": 2, "num_cpus": 0.5},
    ),
    "personal state (Ditto)": tiny(
        rounds=4, algorithm={"name": "ditto"}, workers={"count": 1, "execution": "sequential"}
    ),
}


@pytest.mark.parametrize(
    "case",
    # sync and async in the matrix tier (suite time): the Ditto case runs the same links
    [c if c.startswith("personal") else pytest.param(c, marks=pytest.mark.matrix) for c in CASES],
)
def test_links_give_the_runs_that_calls_give(ray_cluster, case):
    cfg = {**CASES[case], "tracking": {"enabled": False}}
    linked, called = _run(cfg, "auto"), _run(cfg, "calls")
    _same(linked, called)
    assert linked[2]["link"] > 0 and linked[2]["call"] == 0, linked[2]
    assert called[2]["link"] == 0


@pytest.mark.matrix
def test_more_batches_in_flight_than_a_link_holds(ray_cluster, monkeypatch):
    """The async case with a link that holds 1 request: each send first reads the oldest."""
    import raysim.actors.pool as pool

    monkeypatch.setattr(pool, "MAX_IN_FLIGHT", 1)
    cfg = {**CASES["async, results kept for later rounds"], "tracking": {"enabled": False}}
    _same(_run(cfg, "auto"), _run(cfg, "calls"))


@pytest.mark.matrix
def test_a_worker_killed_while_linked_is_replaced_and_the_run_unchanged(ray_cluster):
    """Its batch goes again as a plain call on the restarted process; the other worker keeps
    its link."""
    cfg = {**CASES["sync, 2 workers"], "tracking": {"enabled": False}}
    clean = _run(cfg, "auto")
    faulty = _run(cfg, "auto", ["faults.kill_worker.round=1", "faults.kill_worker.worker=0"])
    _same(faulty, clean)
    assert sum(m["worker_restarts"] for m in faulty[1]) == 1
    assert faulty[2]["call"] > 0 and faulty[2]["link"] > 0, faulty[2]


def test_a_larger_model_takes_plain_calls(ray_cluster, monkeypatch):
    """Only a global vector up to ``LINK_MAX_BYTES`` is linked (here lowered below the tiny
    MLP's 9 KB)."""
    import raysim.actors.pool as pool

    monkeypatch.setattr(pool, "LINK_MAX_BYTES", 1000)
    cfg = {**CASES["sync, 2 workers"], "tracking": {"enabled": False}}
    _, _, sent = _run(cfg, "auto", linked=False)
    assert sent["link"] == 0 and sent["call"] > 0


def test_a_short_run_builds_no_graph(ray_cluster):
    """A coordinator in a driver (here, the test's process) that ends within ``LINK_AFTER_S`` of
    its first batch starts no compiled graph (each would start a process of its own there) and
    takes plain calls throughout."""
    cfg = load_config({**CASES["sync, 2 workers"], "tracking": {"enabled": False}})
    session = raysim.RunSession(cfg, coordinator_here=True)
    try:
        list(session.rounds())
        pool = session.here.pool
        assert pool._links == {} and pool.sent["link"] == 0 and pool.sent["call"] > 0
    finally:
        session.close()


def test_a_coordinator_actor_links_at_its_first_batch_and_starts_no_proxy(ray_cluster):
    """In an actor, a link's graph takes the coordinator's own actor as its driver proxy
    (``compiled._proxy_is_this_actor``), so the links are built at the first batch and the run
    starts no ``DAGDriverProxyActor``; the linked run gives the run plain calls give."""
    import ray._private.state as state

    def proxies() -> set[str]:
        return {k for k, a in state.actors().items() if a["ActorClassName"].endswith("ProxyActor")}

    cfg = {**CASES["sync, 2 workers"], "tracking": {"enabled": False}}
    before = proxies()
    session = raysim.RunSession(load_config(cfg))

    def pool(fn):  # ``fn`` of the pool inside the coordinator's actor
        return ray.get(session.actor.__ray_call__.remote(lambda c: fn(c.pool)))

    try:
        session.step()
        assert pool(lambda p: p._linking), "no link started at the first batch"
        assert pool(lambda p: p.wait_for_links())
        list(session.rounds())
        linked = (session.finish(), [], pool(lambda p: dict(p.sent)))
    finally:
        session.close()
    assert proxies() == before
    assert linked[2]["link"] > 0, linked[2]
    called = _run(cfg, "calls")
    assert linked[0].weights_digest == called[0].weights_digest


def test_a_link_from_another_actor_gives_the_worker_a_stand_in_for_its_class(ray_cluster):
    """A worker reads the handle of the actor that builds its link (the graph's driver proxy).
    From an actor other than the coordinator (a Tune trial's process, whose class loads Tune),
    the worker takes a stand-in class for it instead of loading it; the link works."""
    from raysim.actors.compiled import WorkerLink, _StandIn
    from raysim.actors.pool import WorkerLaunch

    launch = WorkerLaunch.for_config(load_config(CASES["sync, 2 workers"]), 1)

    @ray.remote(num_cpus=0)
    class Host:
        def link(self, node: str) -> tuple[bool, str]:
            worker = launch.start()
            link = WorkerLink(worker, node)
            deadline = time.monotonic() + 60
            while not (link.ready or link.failed) and time.monotonic() < deadline:
                time.sleep(0.05)
            mine = ray.get_runtime_context().current_actor._ray_actor_creation_function_descriptor

            def loaded(w: object) -> str:
                from ray._private.worker import global_worker

                classes = global_worker.function_actor_manager._loaded_actor_classes
                return classes[mine.function_id].__name__

            taken = ray.get(worker.__ray_call__.remote(loaded))
            link.close()
            ray.kill(worker)
            return link.failed is None, taken

    linked, taken = ray.get(Host.remote().link.remote(ray.get_runtime_context().get_node_id()))
    assert linked
    assert taken == _StandIn.__name__


@pytest.mark.matrix  # suite time (~16 s on 2 vCPUs): the fast suite's budget
def test_in_process_trains_in_the_coordinator_actor_and_gives_the_same_run(ray_cluster):
    """``workers.transport: in_process``: the coordinator's actor trains the one worker's
    clients itself, with the weights and metrics a worker actor gives (Ditto's personal state
    included), no Worker actor alive, and the worker's CPU share on the coordinator."""
    import ray
    import ray._private.state as state

    cfg = {**CASES["personal state (Ditto)"], "tracking": {"enabled": False}}
    runs = {}
    for transport in ("in_process", "calls"):
        session = raysim.RunSession(load_config(cfg, [f"workers.transport={transport}"]))
        try:
            metrics = list(session.rounds())
            alive = [a["ActorClassName"] for a in state.actors().values() if a["State"] == "ALIVE"]
            free = ray.available_resources().get("CPU", 0.0)
            runs[transport] = (session.finish(), metrics, {}), alive, session.workers(), free
        finally:
            session.close()
    _same(runs["in_process"][0], runs["calls"][0])
    (_, alive, workers, free), (_, alive_calls, _, free_calls) = runs.values()
    assert "Coordinator" in alive and "Worker" not in alive, alive
    assert "Worker" in alive_calls  # the control: the same listing sees a worker actor
    assert [w["mode"] for w in workers] == ["in_process"]
    assert workers[0]["pid"] != __import__("os").getpid()  # the coordinator's, not the driver's
    assert free == free_calls < ray.cluster_resources()["CPU"]  # the same share, held


def test_in_process_refuses_what_it_cannot_train(ray_cluster):
    """Two workers, worker GPUs, or a worker-killing fault: one ConfigError naming the way out,
    before anything starts."""
    from raysim.config import ConfigError

    base = {**CASES["sync, 2 workers"], "tracking": {"enabled": False}}
    for extra in (
        [],
        ["workers.count=1", "faults.kill_worker.round=1", "faults.kill_worker.worker=0"],
    ):
        cfg = load_config(base, ["workers.transport=in_process", *extra])
        with pytest.raises(ConfigError, match="workers.transport=auto"):
            raysim.RunSession(cfg)
