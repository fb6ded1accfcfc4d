"""Population size: FedAvg on ``synthetic`` through ``raysim run``, 100 clients per round, J in
{10^3, 10^4, 10^5, 10^6} (issue 43).

Per J: the median round's wall time (rounds 3 to the last, MLflow's ``round_wall_s``; the first
rounds warm the workers up), its ratio to the smallest J's round, and the peak resident memory
of the driver, the coordinator and the largest worker, polled every 50 ms from the process tree
(Ray's processes included). Goals (issue 43): a round at 10^6 within 1.2x of a round at 10^3;
the coordinator at 10^6 within 2 GB.

    python benchmarks/population.py                       # J = 1e3 1e4 1e5 1e6, 20 rounds
    python benchmarks/population.py --clients 1000 1000000 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, machine

EXAMPLE = ROOT / "examples" / "synthetic.yaml"


def _role(cmdline: str) -> str | None:
    if "ray::Coordinator" in cmdline:
        return "coordinator"
    if "ray::Worker" in cmdline:
        return "worker"
    return None


class PeakMemory(threading.Thread):
    """Polls the resident memory of a process and its descendants; the peak per role."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.peak: dict[str, int] = {"driver": 0, "coordinator": 0, "worker": 0}
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self.done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            for p in procs:
                try:
                    role = "driver" if p.pid == self.pid else _role(" ".join(p.cmdline()))
                    if role is not None:
                        self.peak[role] = max(self.peak[role], p.memory_info().rss)
                except psutil.Error:
                    continue
            time.sleep(self.every_s)


def one_run(clients: int, rounds: int, store: Path) -> dict[str, float]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}"}
    env.pop("RAY_ADDRESS", None)
    argv = [sys.executable, "-m", "raysim.cli", "run", str(EXAMPLE)]
    argv += [f"clients.num={clients}", f"rounds={rounds}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=store, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watch = PeakMemory(proc.pid)
    watch.start()
    out, err = proc.communicate()
    watch.done.set()
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"J={clients}: exit {proc.returncode}: {err.strip()[-400:]}")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("raysim")
    (run,) = client.search_runs([exp.experiment_id], max_results=1)
    walls = client.get_metric_history(run.info.run_id, "round_wall_s")
    steady = [m.value for m in sorted(walls, key=lambda m: m.step)][2:]
    return {
        "round_s": statistics.median(steady),
        "command_s": total,
        **{f"{k}_gb": v / 2**30 for k, v in watch.peak.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    rows = []
    for j in args.clients:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append((j, one_run(j, args.rounds, Path(tmp))))
        r = rows[-1][1]
        print(
            f"J={j}: round {r['round_s'] * 1e3:.0f} ms, command {r['command_s']:.1f} s", flush=True
        )
    base = rows[0][1]["round_s"]
    print(
        f"\nFedAvg on synthetic(1,1), {args.rounds} rounds, 100 clients a round\n\n"
        "| J | round (median, ms) | vs smallest J | command (s) | driver peak (GB) | "
        "coordinator peak (GB) | largest worker peak (GB) |\n|---|---|---|---|---|---|---|"
    )
    for j, r in rows:
        print(
            f"| {j:,} | {r['round_s'] * 1e3:.0f} | {r['round_s'] / base:.2f}x | "
            f"{r['command_s']:.1f} | {r['driver_gb']:.2f} | {r['coordinator_gb']:.2f} | "
            f"{r['worker_gb']:.2f} |"
        )


if __name__ == "__main__":
    main()
