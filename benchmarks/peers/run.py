"""``peers``: the quickstart through ``raysim run``, a plain script, pfl-research and Flower.

    bash benchmarks/peers/setup.sh              # once: each peer's venv, from PyPI
    .venv/bin/python benchmarks/peers/run.py [--repeats 3] [--rounds 30]

Each repeat runs the four as whole processes, one after another (interleaved, so that this
machine's drift hits them alike), on the same client data (``export.py``: raysim's split, read
by the twins from an .npz):

- ``raysim``: ``python -m raysim.cli run examples/quickstart.yaml`` in a fresh folder (a fresh
  MLflow store, as a new user's first run); its rounds' times are the store's ``wall_time``;
- ``plain``: ``overhead.run_plain`` (one thread), the same training without a framework;
- ``pfl``, ``flower``: ``pfl_quickstart.py``, ``flower_quickstart.py`` in their own venvs.

Printed per framework: the whole process's wall and its steady round (the median interval
between round ends after the first 3), medians over repeats, and the last round's accuracy;
then the ratios the issue asks for, each measured in this run: ``raysim_vs_plain.whole``,
``raysim_vs_plain.round``, ``raysim_vs_pfl.round``, ``flower_vs_raysim.round``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: common, overhead

from common import QUICKSTART, machine, report  # noqa: E402

VENVS = HERE / ".venvs"
TWINS = {"pfl": HERE / "pfl_quickstart.py", "flower": HERE / "flower_quickstart.py"}


def plain_child(rounds: int) -> None:
    """The plain script, printing the runner's protocol (round ends, then the accuracy)."""
    from overhead import run_plain

    from raysim.config import load_config

    cfg = load_config(QUICKSTART, [f"rounds={rounds}", "tracking.enabled=false"])
    scores: dict[str, float] = {}
    walls = run_plain(cfg, 1, scores)[0]
    end = time.time()
    for k in range(len(walls)):  # each round's end, from the walls of the rounds after it
        print(f"round={k + 1} t={end - sum(walls[k + 1 :])}")
    print(f"accuracy={scores['accuracy']}", flush=True)


def parse(out: str) -> tuple[list[float], float]:
    """Round-end times and the accuracy from a twin's output."""
    ends, accuracy = [], float("nan")
    for line in out.splitlines():
        if line.startswith("round="):
            ends.append(float(line.split("t=")[1]))
        elif line.startswith("accuracy="):
            accuracy = float(line.split("=")[1])
    return ends, accuracy


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall, done.stdout


def run_raysim(rounds: int, folder: Path) -> dict[str, float]:
    from raysim.tracking.store import open_store

    store = folder / "mlflow.db"
    cmd = [sys.executable, "-m", "raysim.cli", "run", str(QUICKSTART), f"rounds={rounds}"]
    wall, _ = timed([*cmd, f"tracking.uri=sqlite:///{store}"], folder)
    client = open_store(f"sqlite:///{store}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    ends = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "wall_time"),
                                    key=lambda m: m.step)]  # fmt: skip
    return {"whole_s": wall, "round_s": steady(ends), "accuracy": run.data.metrics["accuracy"]}


def run_other(name: str, rounds: int, data: Path, folder: Path) -> dict[str, float]:
    if name == "plain":
        cmd = [sys.executable, __file__, "--plain-child", "--rounds", str(rounds)]
    else:
        cmd = [str(VENVS / name / "bin" / "python"), str(TWINS[name]), "--data", str(data)]
        cmd += ["--rounds", str(rounds)]
    wall, out = timed(cmd, folder)
    ends, accuracy = parse(out)
    if len(ends) != rounds:
        raise SystemExit(f"{name}: {len(ends)} rounds reported, {rounds} expected:\n{out[-2000:]}")
    return {"whole_s": wall, "round_s": steady(ends), "accuracy": accuracy}


def steady(ends: list[float], warmup: int = 3) -> float:
    """The median interval between round ends after the first ``warmup`` rounds."""
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)][warmup - 1 :]
    return statistics.median(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=["raysim", "plain", "pfl", "flower"])
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_child:
        plain_child(args.rounds)
        return
    missing = [n for n in TWINS if n in args.only and not (VENVS / n / ".installed").exists()]
    if missing:
        raise SystemExit(f"no venv for {', '.join(missing)}: run bash benchmarks/peers/setup.sh")
    print(f"machine={machine()}", flush=True)
    report("config", rounds=args.rounds, repeats=args.repeats, workload=QUICKSTART.name)
    from export import export

    got: dict[str, list[dict[str, float]]] = {n: [] for n in args.only}
    with tempfile.TemporaryDirectory() as tmp:
        data = export(Path(tmp) / "quickstart.npz")
        for r in range(args.repeats):
            for name in args.only:
                folder = Path(tmp) / f"{name}{r}"
                folder.mkdir()
                if name == "raysim":
                    got[name].append(run_raysim(args.rounds, folder))
                else:
                    got[name].append(run_other(name, args.rounds, data, folder))
                report(f"repeat{r}.{name}", **got[name][-1])
    med = {
        n: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for n, runs in got.items()
    }
    for name, values in med.items():
        report(name, **values)
    ratios = {
        "raysim_vs_plain.whole": ("raysim", "plain", "whole_s"),
        "raysim_vs_plain.round": ("raysim", "plain", "round_s"),
        "raysim_vs_pfl.round": ("raysim", "pfl", "round_s"),
        "raysim_vs_pfl.whole": ("raysim", "pfl", "whole_s"),
        "flower_vs_raysim.round": ("flower", "raysim", "round_s"),
        "flower_vs_raysim.whole": ("flower", "raysim", "whole_s"),
    }
    for key, (a, b, what) in ratios.items():
        if a in med and b in med:
            print(f"{key}={med[a][what] / med[b][what]:.3f}")


if __name__ == "__main__":
    main()
