"""``startup``: the quickstart as a whole process, ``raysim run`` against a plain script.

A user types ``raysim run examples/quickstart.yaml``; the reference is the same training as a plain
single-process PyTorch script (``overhead.run_plain``: same data, schedule, seeds, aggregation and
evaluation, one thread), started as its own process too. Both are timed from process start to
exit, interleaved per repeat, and the medians are compared: ``startup_ratio`` = raysim / plain.

``--phases`` also runs the raysim side once in this process, phase by phase (imports, Ray start,
coordinator and workers ready, the rounds, finishing and closing), so that the fixed cost has
names. The raysim side writes to a fresh MLflow store in a temporary folder, as a new user's first
run does (tracking on).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import QUICKSTART, ROOT, machine, report

BIN = Path(sys.executable).parent


def plain_child(config: str) -> None:
    """The plain script: imports, dataset, training and evaluation, then exit."""
    from overhead import run_plain

    from raysim.config import load_config

    walls, digest = run_plain(load_config(config, ["tracking.enabled=false"]), threads=1)
    print(f"plain rounds={len(walls)} digest={digest[:8]}")


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return wall


def phases(config: str, store: Path) -> dict[str, float]:
    """The raysim side in this process, one phase at a time (seconds)."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    import raysim  # noqa: F401
    from raysim.config import load_config
    from raysim.launch.session import RunSession

    cfg = load_config(config, [f"tracking.uri=sqlite:///{store / 'phases.db'}"])
    out["import"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    from raysim.launch.session import ensure_ray

    ensure_ray()
    out["ray_start"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    session = RunSession(cfg)
    session.workers()
    out["session_ready"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = None
    while not session.done:
        session.step()
        if first is None:
            first = time.perf_counter() - t0
    out["first_round"] = first or 0.0
    out["rounds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    session.finish()
    out["finish"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    session.close()
    import ray

    ray.shutdown()
    out["close"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(QUICKSTART))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--phases", action="store_true", help="also time raysim phase by phase")
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_child:
        plain_child(args.config)
        return
    print(f"machine={machine()}", flush=True)
    report("config", file=args.config, repeats=args.repeats)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}"}
    walls: dict[str, list[float]] = {"plain": [], "raysim": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            plain = [sys.executable, str(Path(__file__)), "--plain-child", "--config", args.config]
            walls["plain"].append(timed(plain, ROOT, env))
            store = Path(tmp) / f"store{r}"
            store.mkdir()
            run = [str(BIN / "raysim"), "run", args.config]
            walls["raysim"].append(timed(run, store, env))  # a new user's folder: a fresh store
            report(f"repeat{r}", plain_s=walls["plain"][-1], raysim_s=walls["raysim"][-1])
        if args.phases:
            report("phases", **phases(args.config, Path(tmp)))
    plain, raysim = (statistics.median(walls[k]) for k in ("plain", "raysim"))
    report("median", plain_s=plain, raysim_s=raysim)
    report(startup_ratio=raysim / plain)


if __name__ == "__main__":
    main()
