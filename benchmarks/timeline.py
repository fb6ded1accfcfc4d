"""``timeline``: where a steady round of ``raysim run`` goes, process by process.

Runs the quickstart as ``raysim run`` does (``RunSession.rounds``: rounds in batches per driver
call, evaluation overlapped, MLflow on, a fresh sqlite store) with ``RAYSIM_TIMELINE`` set, so the
driver, the coordinator and each worker write their spans (``raysim.tracking.timeline``), then the
plain
loop (``overhead.run_plain``, one thread) as the reference in the same script.

For the rounds after ``--warmup``, it prints each span's milliseconds per round, by process, and
the round's wall against the plain loop's (``round_vs_plain``). Spans nest: the coordinator's
``advance call`` holds its rounds; ``arrivals`` holds ``result wait``; a worker's ``train``
follows its ``fetch versions``. ``--plot PATH`` draws three steady rounds as a Gantt chart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from common import QUICKSTART, machine, report

#: spans that hold many rounds: not used to find where rounds start and end
CALLS = {"advance call", "driver call"}


def run_raysim(
    config: str, rounds: int, folder: Path, workers: int, extra: list[str]
) -> list[float]:
    """The quickstart through ``RunSession.rounds`` with the timeline on; each round's wall."""
    os.environ["RAYSIM_TIMELINE"] = str(folder / "spans")  # before Ray starts: inherited
    from raysim.config import load_config
    from raysim.launch.session import RunSession

    overrides = [
        f"rounds={rounds}",
        f"tracking.uri=sqlite:///{folder / 'mlflow.db'}",
        f"workers.count={workers}",
        *extra,
    ]
    session = RunSession(load_config(config, overrides))
    try:
        session.workers()
        walls = [m["wall_time"] for m in session.rounds()]
        session.finish()
    finally:
        session.close()
    return [b - a for a, b in zip(walls, walls[1:], strict=False)]


def per_round(spans: list[dict], first: int, last: int) -> dict[tuple[str, str], float]:
    """Milliseconds per round of each (role, span) within rounds ``first``..``last``: spans
    with a round are kept by it; the others by time, inside the window those rounds span."""
    inside = [s for s in spans if first <= s["round"] <= last and s["name"] not in CALLS]
    start = min(s["start"] for s in inside if s["role"] == "coordinator")
    end = max(s["end"] for s in inside if s["role"] == "coordinator")
    total: dict[tuple[str, str], float] = defaultdict(float)
    for s in spans:
        by_round = s["round"] >= 0 and s["name"] not in CALLS
        keep = first <= s["round"] <= last if by_round else start <= s["start"] < end
        if keep:
            total[(s["role"], s["name"])] += (s["end"] - s["start"]) * 1e3
    n = last - first + 1
    return {key: ms / n for key, ms in sorted(total.items())}


def plot(spans: list[dict], first: int, path: Path) -> None:
    """Rounds ``first``..``first + 2`` as bars, one row per process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inside = [
        s
        for s in spans
        if first <= s["round"] <= first + 2
        and s["role"] == "coordinator"
        and s["name"] not in CALLS
    ]
    t0, t1 = min(s["start"] for s in inside), max(s["end"] for s in inside)
    shown = [s for s in spans if s["end"] > t0 and s["start"] < t1]
    rows = sorted({(s["role"], s["pid"]) for s in shown})
    names = sorted({s["name"] for s in shown})
    colors = dict(zip(names, plt.cm.tab20.colors, strict=False))
    fig, ax = plt.subplots(figsize=(12, 1 + 0.8 * len(rows)))
    for y, row in enumerate(rows):
        for s in (s for s in shown if (s["role"], s["pid"]) == row):
            left = (max(s["start"], t0) - t0) * 1e3
            width = (min(s["end"], t1) - max(s["start"], t0)) * 1e3
            ax.barh(y, width, left=left, color=colors[s["name"]], edgecolor="black", lw=0.3)
    ax.set_yticks(range(len(rows)), [f"{r} {p}" for r, p in rows])
    ax.set_xlabel("ms")
    ax.set_title(f"rounds {first}–{first + 2} of the quickstart through raysim run")
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names],
        labels=names,
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1, 1),
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(QUICKSTART))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="rounds left out at the start")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of three steady rounds")
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides (both sides)")
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    from overhead import run_plain

    from raysim.config import load_config
    from raysim.tracking import timeline

    with tempfile.TemporaryDirectory() as tmp:
        walls = run_raysim(args.config, args.rounds, Path(tmp), args.workers, args.set)
        spans = timeline.read(Path(tmp) / "spans")
    plain = run_plain(load_config(args.config, [f"rounds={args.rounds}", *args.set]), 1)[0]
    raysim_round = statistics.median(walls[args.warmup :]) * 1e3
    plain_round = statistics.median(plain[args.warmup :]) * 1e3
    for (role, name), ms in per_round(spans, args.warmup, args.rounds - 1).items():
        report(f"span.{role}.{name.replace(' ', '_')}", ms_per_round=ms)
    report("round_ms", raysim=raysim_round, plain=plain_round)
    print(f"round_vs_plain={raysim_round / plain_round:.3f}")
    if args.plot:
        plot(spans, args.warmup, args.plot)
        print(f"plot={args.plot}")


if __name__ == "__main__":
    main()
