"""Personal state beyond memory (issue 43): 8 MiB of ``ClientContext.state`` per client, 3,000
clients (24 GiB of state), 100 per round, 40 rounds, with ``clients.state.store: disk``.

The method is ``benchmarks/plugins/ballast.py``: FedAvg on ``synthetic`` whose clients check on
every visit that the state came back as they left it. Reported: whether it completed, visits and
broken states, the peak proportional set size (PSS: shared memory counted once) of the driver and
every process under it (Ray's and raysim's) together, polled every 0.5 s, and a client visit's
cost against the disk: the time to write 8 MiB through the store (flushed to disk) and read it
back, measured in this script on the same folder, and the same run with 8 KiB per client (the
visit without the state's I/O).

    python benchmarks/state_beyond_ram.py                          # the issue's shape (~10 min)
    python benchmarks/state_beyond_ram.py --clients 300 --rounds 10  # a quick look
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from common import ROOT, machine, raysim_run

EXAMPLE = ROOT / "examples" / "synthetic.yaml"
PLUGIN = ROOT / "benchmarks" / "plugins" / "ballast.py"


def disk_round_trip(folder: Path, mib: float, repeats: int = 5) -> float:
    """Median seconds to save ``mib`` MiB through the store (fsync, rename) and load it back."""
    from raysim.state.store import DiskStateStore

    store = DiskStateStore(folder / "probe", cache_bytes=0)
    entry = {"a": np.random.default_rng(0).random(int(mib * 2**18), dtype=np.float32)}
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        token = store.save(i, i, entry)
        store.load(token)
        times.append(time.perf_counter() - t0)
        store.delete(token)
    return statistics.median(times)


def one_run(args: argparse.Namespace, mib: float, folder: Path) -> dict[str, float]:
    done = raysim_run(
        [
            str(EXAMPLE),
            f"clients.num={args.clients}",
            f"clients.per_round={args.per_round}",
            f"rounds={args.rounds}",
            f"algorithm={{name: ballast, module: {PLUGIN}, mib: {mib}}}",
            "clients.state.store=disk",
            f"clients.state.dir={folder / 'states'}",
            f"eval.every={args.rounds}",
        ],
        folder,
        every_s=0.5,
        pss=True,
    )
    m = done.run.data.metrics
    with tempfile.TemporaryDirectory() as tmp:
        path = done.client.download_artifacts(done.run.info.run_id, "workers.json", tmp)
        workers = len(json.loads(Path(path).read_text()))
    return {
        "command_s": done.seconds,
        "round_s": statistics.median(done.metric("round_wall_s")[2:]),
        "visits": m.get("ballast_visits", 0.0),
        "broken": m.get("ballast_broken", -1.0),
        "peak_pss_gb": done.memory.peak["pss"] / 2**30,
        "workers": float(workers),
        "store_gb": sum(f.stat().st_size for f in (folder / "states").rglob("*")) / 2**30,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--mib", type=float, default=8.0)
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    base = Path(args.dir or tempfile.mkdtemp(prefix="raysim-state-"))
    base.mkdir(parents=True, exist_ok=True)
    io_s = disk_round_trip(base, args.mib)
    print(f"disk: save (fsync) + load of {args.mib:g} MiB through the store: {io_s * 1e3:.1f} ms")
    rows = {}
    for mib in (args.mib, 1 / 128):
        folder = base / f"run-{mib:g}"
        folder.mkdir()
        rows[mib] = one_run(args, mib, folder)
        r = rows[mib]
        print(f"{mib:g} MiB a client: {r}", flush=True)
        shutil.rmtree(folder / "states", ignore_errors=True)
    big, small = rows[args.mib], rows[1 / 128]
    per = args.per_round / max(big["workers"], 1.0)  # visits each worker runs a round
    visit = big["round_s"] / per
    bare = small["round_s"] / (args.per_round / max(small["workers"], 1.0))
    print(
        f"\n{args.clients} clients x {args.mib:g} MiB = "
        f"{args.clients * args.mib / 1024:.1f} GiB of state, {args.per_round} a round, "
        f"{args.rounds} rounds, clients.state.store: disk\n\n| | {args.mib:g} MiB a client | "
        "8 KiB a client |\n|---|---|---|"
    )
    for key, label in (
        ("visits", "visits"),
        ("broken", "states that came back changed"),
        ("peak_pss_gb", "peak PSS of all processes (GB)"),
        ("store_gb", "store on disk at the end (GB)"),
        ("round_s", "round, median (s)"),
        ("workers", "workers"),
        ("command_s", "command (s)"),
    ):
        print(f"| {label} | {big[key]:.3g} | {small[key]:.3g} |")
    print(
        f"\na visit: {visit * 1e3:.1f} ms with the state, {bare * 1e3:.1f} ms without; the "
        f"state's write and read on this disk: {io_s * 1e3:.1f} ms; visit / I/O = "
        f"{visit / io_s:.2f}x (goal: at most 2x)"
    )


if __name__ == "__main__":
    main()
