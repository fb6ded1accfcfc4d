"""``round_trip``: the quickstart's steady rounds through Ray, one driver call per round
(``RunSession.step``) against batches of rounds per call (``RunSession.rounds``, the coordinator
running rounds back to back for up to ``api.ADVANCE_S``).

One private Ray, one worker, tracking off, no delays, the default (batched) execution. Each
repeat runs both ways, interleaved: 5 warm-up rounds by ``step``, then the rest timed. Last lines:
the medians per round and ``rounds_vs_step``; both ways must end on the same digest.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import QUICKSTART, machine, report

from raysim.config import load_config
from raysim.launch.session import RunSession, ensure_ray

WARMUP = 5


def timed(cfg, mode: str) -> tuple[float, str]:
    session = RunSession(cfg)
    try:
        session.workers()
        for _ in range(WARMUP):
            session.step()
        t0 = time.perf_counter()
        if mode == "step":
            while not session.done:
                session.step()
        else:
            for _ in session.rounds():
                pass
        per_round = (time.perf_counter() - t0) / (cfg.rounds - WARMUP)
        return per_round, session.finish().weights_digest
    finally:
        session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    ensure_ray(num_cpus=2)
    overrides = [f"rounds={args.rounds}", "tracking.enabled=false", "delays.kind=none"]
    cfg = load_config(QUICKSTART, [*overrides, "workers.count=1"])
    walls: dict[str, list[float]] = {"step": [], "rounds": []}
    digests: set[str] = set()
    for _ in range(args.repeats):
        for mode in walls:
            wall, digest = timed(cfg, mode)
            walls[mode].append(wall)
            digests.add(digest)
    for mode, values in walls.items():
        report(mode, round_ms_each=" ".join(f"{v * 1e3:.1f}" for v in values))
        report(mode, round_ms=statistics.median(values) * 1e3)
    report(same_digest=len(digests) == 1)
    report(rounds_vs_step=statistics.median(walls["rounds"]) / statistics.median(walls["step"]))


if __name__ == "__main__":
    main()
