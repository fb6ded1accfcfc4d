"""Per-trial overhead of a Tune sweep against a plain ``raysim run`` of the same config.

Both sides run the same config (``examples/tune-async.yaml`` cut to a few rounds, one worker) on
a private Ray of its own, started just before it as ``raysim run`` and ``raysim tune`` start
theirs (not timed), interleaved, ``--repeats`` times. A Ray shared by both sides would hand each
the idle worker processes the side before it left (a sweep leaves one, a plain run none), where
a fresh Ray has one per CPU for both.

- the plain run: ``raysim.RunSession`` stepped to the end, then ``close()``;
- the sweep: ``raysim.tune`` with a one-point space (one trial, the same values), its one worker
  with ``tune.worker=auto`` (one trial: the worker is a Ray actor, as in the plain run);
- with ``--here``, a third side: the same sweep with ``tune.worker=here`` (the worker trained in
  the trial's own process).

Measured on each side:

- ``start_s``: from the call to the end of the first round (the first ``step()`` returning; for
  the trial, the first ``on_result``, which each round sends since ``eval.every=1``);
- ``release_s``: from the run's end (``finish()`` returned: its artifacts are written; the
  trial's last report says when) to the moment no Coordinator, Worker or trial actor is alive,
  seen by a thread polling Ray's actor table every 20 ms;
- ``steady_s``: the wall time of rounds 2..N over N - 1, from the ``wall_time`` each round
  reports (the run's clock in the coordinator's process, which in a trial counts the waits for
  Tune's controller too). A trial sends its reports several at a time, so their arrival in the
  driver does not time its rounds;
- ``next_start_s`` (``--trials`` > 1: one sweep of that many identical trials, one at a time):
  from a trial's last report to the next trial's first, the start a trial pays when Tune hands
  it the previous trial's process (``reuse_actors``).

``--wall N`` (after the rest): whole sweeps of ``N`` trials, two side by side, with
``tune.worker=auto`` (trials train in the processes Tune hands on) and ``tune.worker=actor``,
interleaved ``--repeats`` times: ``wall.auto_s``, ``wall.actor_s`` (medians) and their ratio.

Last lines: ``ratio.start`` and ``ratio.release`` = sweep / plain (medians over repeats), and
``ratio_here.*`` for the third side. The series (``--trials``) runs with ``tune.worker=auto``:
more trials than run at once, so each trial trains in the process Tune hands on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from common import ROOT, machine, report

from raysim.launch.private_ray import ensure_ray

WATCHED = ("Coordinator", "Worker", "RunTrial")
POLL_S = 0.02


class ActorWatch(threading.Thread):
    """Records the last time any watched actor was seen alive."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.last_alive = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        import ray._private.state as state

        while not self.stop.is_set():
            alive = [
                a for a in state.actors().values()
                if a["State"] == "ALIVE" and a["ActorClassName"] in WATCHED
            ]  # fmt: skip
            if alive:
                self.last_alive = time.time()
            time.sleep(POLL_S)


@contextlib.contextmanager
def fresh_ray() -> Iterator[None]:
    """A private Ray for one side, as ``raysim run`` or ``raysim tune`` would start it."""
    import ray

    ensure_ray(logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


def base_config(rounds: int, transport: str = "auto", worker: str = "auto") -> dict:
    import yaml

    cfg = yaml.safe_load((ROOT / "examples/tune-async.yaml").read_text())
    cfg.update(rounds=rounds, eval={"every": 1})
    cfg["workers"] = {"count": 1, "num_cpus": 0.5, "transport": transport}
    cfg["tracking"]["experiment"] = "bench-tune-overhead"
    cfg["tune"].update(num_samples=1, scheduler="fifo", worker=worker)
    cfg["tune"]["space"] = {"algorithm.buffer_size": {"grid": [10]}}
    return cfg


def plain(cfg: dict) -> dict[str, float]:
    import raysim

    watch = ActorWatch()
    watch.start()
    t0 = time.perf_counter()
    session = raysim.RunSession(raysim.load_config(cfg, ["algorithm.buffer_size=10"]))
    marks, walls = [], []
    try:
        while not session.done:
            walls.append(session.step()["wall_time"])
            marks.append(time.perf_counter())
        session.finish()
        finished_at = time.time()
    finally:
        session.close()
    return _measures(t0, marks, walls, finished_at, watch)


def sweep(cfg: dict, storage: Path) -> dict[str, float]:
    import raysim
    from raysim.sweeps.trial import FINISHED_AT

    watch = ActorWatch()
    watch.start()
    marks: list[float] = []
    walls: list[float] = []
    last: dict = {}

    def on_result(trial: str, result: dict) -> None:
        marks.append(time.perf_counter())
        walls.append(result["wall_time"])
        last.update(result)

    t0 = time.perf_counter()
    raysim.tune(cfg, storage=storage, on_result=on_result)
    return _measures(t0, marks, walls, last[FINISHED_AT], watch)


def series(cfg: dict, storage: Path, trials: int) -> float:
    """Median gap from one trial's last report to the next trial's first, ``trials`` in a row."""
    import raysim

    cfg = {**cfg, "tune": {**cfg["tune"], "num_samples": trials, "max_concurrent_trials": 1}}
    marks: dict[str, list[float]] = {}

    def on_result(trial: str, result: dict) -> None:
        marks.setdefault(trial, []).append(time.perf_counter())

    raysim.tune(cfg, storage=storage, on_result=on_result)
    runs = sorted(marks.values(), key=lambda m: m[0])
    return statistics.median(b[0] - a[-1] for a, b in zip(runs, runs[1:], strict=False))


def sweep_wall(cfg: dict, storage: Path, trials: int) -> float:
    """Seconds for a whole sweep of ``trials`` identical trials, two side by side."""
    import raysim

    cfg = {**cfg, "tune": {**cfg["tune"], "num_samples": trials, "max_concurrent_trials": 2}}
    t0 = time.perf_counter()
    raysim.tune(cfg, storage=storage)
    return time.perf_counter() - t0


def _measures(
    t0: float, marks: list[float], walls: list[float], finished_at: float, watch: ActorWatch
) -> dict[str, float]:
    time.sleep(0.5)  # let the watcher see the end
    watch.stop.set()
    watch.join()
    return {
        "start_s": marks[0] - t0,
        "release_s": max(0.0, watch.last_alive - finished_at),
        "steady_s": (walls[-1] - walls[0]) / (len(walls) - 1) if len(walls) > 1 else float("nan"),
    }


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--trials", type=int, default=3, help="for next_start_s; 1: skip it")
    parser.add_argument("--transport", default="auto", help="workers.transport of both sides")
    parser.add_argument("--here", action="store_true", help="also sweep with tune.worker=here")
    parser.add_argument("--wall", type=int, default=0, help="whole sweeps of N trials; 0: skip")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        cfg = base_config(args.rounds, args.transport)
        with fresh_ray():  # first-use costs (imports, store schema) out of the way
            sweep(cfg, Path(tmp) / "warm")
        here = base_config(args.rounds, args.transport, worker="here")
        sides: dict[str, list[dict[str, float]]] = {"plain": [], "sweep": []}
        if args.here:
            sides["sweep_here"] = []
        for i in range(args.repeats):
            with fresh_ray():
                sides["plain"].append(plain(cfg))
            with fresh_ray():
                sides["sweep"].append(sweep(cfg, Path(tmp) / f"tune{i}"))
            if args.here:
                with fresh_ray():
                    sides["sweep_here"].append(sweep(here, Path(tmp) / f"here{i}"))
        ensure_ray(logging_level="ERROR")  # the rest shares one Ray
        if args.trials > 1:
            next_start = series(cfg, Path(tmp) / "series", args.trials)
        walls: dict[str, list[float]] = {"auto": [], "actor": []}
        for i in range(args.repeats if args.wall else 0):
            for worker in walls:
                side = base_config(args.rounds, args.transport, worker=worker)
                walls[worker].append(sweep_wall(side, Path(tmp) / f"wall-{worker}{i}", args.wall))
        ray.shutdown()
    medians = {
        side: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for side, runs in sides.items()
    }
    for side, values in medians.items():
        report(side, **values)
    report("watch", poll_s=POLL_S)  # release_s below this is "at once"
    for side, name in (("sweep", "ratio"), ("sweep_here", "ratio_here")):
        if side not in medians:
            continue
        report(
            name,
            start=medians[side]["start_s"] / medians["plain"]["start_s"],
            release=medians[side]["release_s"] / max(medians["plain"]["release_s"], 1e-3),
            steady=medians[side]["steady_s"] / medians["plain"]["steady_s"],
        )
    if args.trials > 1:
        report("series", trials=args.trials, next_start_s=next_start)
        report("ratio", next_start=next_start / medians["plain"]["start_s"])
    if args.wall:
        auto, actor = (statistics.median(walls[w]) for w in ("auto", "actor"))
        report("wall", trials=args.wall, rounds=args.rounds, auto_s=auto, actor_s=actor)
        report("ratio", wall_auto_over_actor=auto / actor)


if __name__ == "__main__":
    main()
