"""``scale_out``: what a round costs the coordinator as nodes are added, with every update sent
whole (``workers.partial_sums=false``, before) and with one partial sum per node (``true``,
after), and where a round on 8 nodes × 8 GPUs would be limited.

A loopback Ray cluster of separate ``ray start`` processes with token authentication, as the
cluster tests start (``tests/loopback.py``): a head with no CPU (the driver and the coordinator
run there, as on a real cluster), and 1, 2 then 3 nodes of one CPU each, one worker each
(``workers.num_cpus=1``), every node with an object store of its own, so what crosses between
nodes goes through Ray's object manager as it would between machines. On each, the quickstart
(FedAvg, digits, an MLP sized by ``model.hidden`` from 10^4 to 10^7 parameters) runs with plain
actor calls (``workers.transport=calls``), one local step a client (``local.max_steps=1``),
clients one after another on their worker (``workers.execution=sequential``), no tracking, and
one evaluation at the end; both settings run back to back on each cluster and size.

Per round, averaged over the rounds between the first (warm-up) and the last (its evaluation):

- **measured** by raysim: ``coordinator_bytes_in`` (updates or partial sums that reached the
  coordinator's process), ``round_compute_s`` (the busiest worker's client seconds),
  ``round_wall_s``, ``server_wall_s``, ``reduce_wall_s`` (``Result.history``);
- **measured** by Ray: bytes each node's object manager received (``ray_object_manager_bytes
  {Type="Received"}`` on each node's metrics port). Objects under 100 KiB travel inside Ray's
  RPCs and are not counted there (a 10^4-parameter model's version and partials);
- **measured** here: the coordinator's serial seconds, the CPU seconds (user + system, all its
  threads) of the coordinator's process over those rounds, read from /proc by the driver; the
  head's raylet (which receives the objects pulled to the coordinator's node) apart;
- **derived** from sizes (``derived_*``): what each node should receive if the run does what it
  says: a worker node the round's version (4 bytes a parameter); the coordinator's node every
  update (clients × 4 bytes a parameter) or one int64 partial per node (nodes × 8 bytes a
  parameter).

The Amdahl bound: with ``s`` the coordinator's serial seconds a round and ``p`` the round's
client work (clients × one client's seconds, from the 1-node run, where the one worker has a
core to itself), ``workers_at_saturation`` = p / s, the number of workers at which each one's
share of the client work falls to the coordinator's serial time; a round then cannot speed up
more than ``max_speedup`` = (s + p) / s whatever the number of workers.

The coordinator's serial seconds are then fitted, per setting, to ``c0 + c_update·clients +
c_byte·bytes_in + c_model·model_bytes`` (non-negative least squares; the reducers' seconds to
``r0 + r_byte·bytes summed``), and a round on 8 nodes × 8 GPUs is **projected** from them for
10^4 to 10^8 parameters and a 7B model's LoRA adapters (q and v, rank 8, 32 layers of 4096:
4.19 M parameters; sizes only). A GPU's client seconds are not measured here: ``--client-s``
is an assumption, and each row says below which client seconds the coordinator limits the
round. The network is an assumption too (``--nic-gbps`` a node).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import QUICKSTART, ROOT, machine

from tests.loopback import RAY, _stop, _wait_ready, free_port

#: model.hidden for about 10^4, 10^5, 10^6, 4.3·10^6 and 10^7 parameters (64 inputs, 10 classes)
HIDDEN = {
    "1e4": [130],
    "1e5": [1330],
    "1e6": [960, 960],
    "4.3e6": [2048, 2048],
    "1e7": [3120, 3120],
}
#: (size, clients a round): the clients vary too, so that per-update and per-byte costs part
FULL = [("1e4", 40), ("1e4", 160), ("1e5", 40), ("1e6", 40), ("1e6", 120), ("4.3e6", 40),
        ("1e7", 20)]  # fmt: skip
QUICK = [("1e4", 40)]
#: the projection's models: parameters (a 7B model's LoRA: q and v, rank 8, 32 layers of 4096)
LORA_7B = 32 * 2 * (8 * 4096 + 4096 * 8)
PROJECTED = {"1e4": 10**4, "1e5": 10**5, "1e6": 10**6, "1e7": 10**7, "1e8": 10**8,
             "7B LoRA q,v r=8": LORA_7B}  # fmt: skip
#: objects up to this size travel inside Ray's RPCs, not through the object manager
INLINE = 100 * 1024


# --------------------------------------------------------------------------- the cluster
@dataclass
class Node:
    proc: subprocess.Popen
    metrics_port: int
    node_id: str = ""


@dataclass
class Loopback:
    """A head (no CPU) and nodes added one at a time, each a ``ray start --block`` process group
    of this script (stopped by signalling those groups, never by ``ray stop``)."""

    temp: Path
    env: dict[str, str]
    gcs: str
    head: Node
    nodes: list[Node] = field(default_factory=list)

    def add_node(self, store_bytes: int) -> None:
        import ray

        before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        port = free_port()
        log = self.temp / f"node{len(self.nodes) + 1}.log"
        proc = subprocess.Popen(
            [RAY, "start", *_common(), *_own_ports(port), f"--address={self.gcs}",
             "--num-cpus=1", "--num-gpus=0", f"--object-store-memory={store_bytes}"],
            env=self.env, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        node = Node(proc, port)
        self.nodes.append(node)
        _wait_ready(proc, log, "Ray runtime started", 120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = {n["NodeID"] for n in ray.nodes() if n["Alive"]} - before
            if new:
                (node.node_id,) = new
                return
            time.sleep(0.5)
        raise RuntimeError("a node started but did not join the cluster")

    def all_nodes(self) -> list[Node]:
        return [self.head, *self.nodes]


def pin_coordinator(node_id: str) -> None:
    """Run every coordinator on the head, beside the driver. With a tracking store on the
    driver's node raysim pins it there itself (``placement.coordinator_options``); tracking is
    off here (MLflow's writes would add to its serial time), and Ray would place a coordinator
    that asks for no CPU on any node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raysim.launch import placement

    unpinned = placement.coordinator_options

    def pinned(cfg: Any, tracking_uri: str | None) -> dict[str, Any]:
        options = unpinned(cfg, tracking_uri)
        options.setdefault("scheduling_strategy", NodeAffinitySchedulingStrategy(node_id, False))
        return options

    placement.coordinator_options = pinned


def _common() -> list[str]:
    return ["--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]


def _own_ports(metrics_port: int) -> list[str]:
    """Each node's agents on ports of their own (as ``tests.loopback`` gives them), its
    metrics where this script reads them."""
    flags = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
             "ray-client-server-port")  # fmt: skip
    return [f"--{flag}={free_port()}" for flag in flags] + [f"--metrics-export-port={metrics_port}"]


@contextmanager
def loopback(head_store: int) -> Iterator[Loopback]:
    """A head with no CPU and no dashboard, this process connected to it."""
    from raysim.launch.private_ray import private_ray_auth

    private_ray_auth()  # this process's token: the cluster's processes and this driver share it
    temp = Path(tempfile.mkdtemp(prefix="rso", dir="/tmp"))  # Ray's socket paths stay short
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=os.environ["RAY_AUTH_TOKEN"])
    env["RAY_metrics_report_interval_ms"] = "500"  # the byte counters refresh twice a second
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    gcs_port, port = free_port(), free_port()
    log = temp / "head.log"
    head = subprocess.Popen(
        [RAY, "start", "--head", *_common(), *_own_ports(port), f"--port={gcs_port}",
         "--num-cpus=0", "--num-gpus=0", "--include-dashboard=false",
         f"--object-store-memory={head_store}", f"--temp-dir={temp}"],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    cluster = Loopback(temp, env, f"127.0.0.1:{gcs_port}", Node(head, port))
    import ray

    try:
        _wait_ready(head, log, "Ray runtime started", 120)
        ray.init(address=cluster.gcs, logging_level="ERROR")
        cluster.head.node_id = ray.get_runtime_context().get_node_id()
        pin_coordinator(cluster.head.node_id)
        yield cluster
    finally:
        ray.shutdown()
        _stop([n.proc for n in reversed(cluster.all_nodes())])


# --------------------------------------------------------------------------- what is read
def received_bytes(node: Node) -> tuple[float, float]:
    """(received, sent) bytes of a node's object manager so far (Ray's own counters)."""
    url = f"http://127.0.0.1:{node.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    got = {"Received": 0.0, "PushedFromLocalPlasma": 0.0}
    for line in text.splitlines():
        if line.startswith("ray_object_manager_bytes{"):
            for kind in got:
                if f'Type="{kind}"' in line:
                    got[kind] = float(line.rsplit(" ", 1)[1])
    return got["Received"], got["PushedFromLocalPlasma"]


def settled_bytes(nodes: list[Node]) -> list[tuple[float, float]]:
    """Every node's counters once two reads 0.6 s apart agree (they refresh every 0.5 s)."""
    last = [received_bytes(n) for n in nodes]
    for _ in range(20):
        time.sleep(0.6)
        now = [received_bytes(n) for n in nodes]
        if now == last:
            return now
        last = now
    return last


def process_in(root: int, needle: str) -> Any:
    """The one process under ``root`` whose command line holds ``needle``."""
    import psutil

    found = [
        p
        for p in psutil.Process(root).children(recursive=True)
        if needle in " ".join(p.cmdline())
    ]
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} processes {needle!r} under the head, not one")
    return found[0]


def cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return t.user + t.system


# --------------------------------------------------------------------------- one run
@dataclass
class Row:
    nodes: int
    size: str
    params: int
    clients: int
    partial_sums: bool
    rounds_measured: int
    digest: str
    worker_nodes: int
    #: per round, means over the measured rounds
    coordinator_bytes_in: float
    bytes_up: float
    head_received: float  # Ray's counter on the coordinator's node
    head_sent: float
    node_received: list[float]  # Ray's counter on each worker node
    derived_head_received: float
    derived_node_received: float
    coordinator_cpu_s: float
    head_raylet_cpu_s: float
    round_wall_s: float
    round_wait_s: float
    server_wall_s: float
    reduce_wall_s: float
    round_compute_s: float
    round_compute_min_s: float
    client_s: float  # the busiest worker's seconds per client it ran


def overrides(hidden: list[int], nodes: int, clients: int, partial: bool, rounds: int) -> list:
    return [
        f"model.hidden={json.dumps(hidden)}",
        f"rounds={rounds}",
        f"eval.every={rounds}",
        f"clients.num={max(100, clients)}",
        f"clients.per_round={clients}",
        "local.max_steps=1",
        "tracking.enabled=false",
        "runtime=ray",
        f"workers.count={nodes}",
        "workers.num_cpus=1",
        "workers.transport=calls",
        "workers.execution=sequential",
        f"workers.partial_sums={str(partial).lower()}",
    ]


def run_one(
    cluster: Loopback, size: str, clients: int, partial: bool, measured: int
) -> Row:
    """One run of ``measured`` + 2 rounds on the cluster as it is; the rounds between the first
    and the last measured (``session.step``: one driver call a round)."""
    from raysim.config import load_config
    from raysim.launch.session import RunSession

    n = len(cluster.nodes)
    rounds = measured + 2
    cfg = load_config(QUICKSTART, overrides(HIDDEN[size], n, clients, partial, rounds))
    session = RunSession(cfg, address=cluster.gcs)
    try:
        workers = session.workers()
        coordinator = process_in(cluster.head.proc.pid, "ray::Coordinator")
        raylet = process_in(cluster.head.proc.pid, "/raylet")
        history = [session.step()]  # the warm-up round
        bytes0 = settled_bytes(cluster.all_nodes())
        cpu0 = cpu_s(coordinator), cpu_s(raylet)
        history += [session.step() for _ in range(measured)]
        cpu1 = cpu_s(coordinator), cpu_s(raylet)
        bytes1 = settled_bytes(cluster.all_nodes())
        while not session.done:
            session.step()
        result = session.finish()
    finally:
        session.close()
    steady = history[1:]
    params = int(workers[0]["base_params"])

    def mean(key: str) -> float:
        return float(np.mean([h.get(key, 0.0) for h in steady]))

    delta = [(b[0] - a[0]) / measured for a, b in zip(bytes0, bytes1, strict=True)]
    sent = (bytes1[0][1] - bytes0[0][1]) / measured
    model = 4 * params
    busiest = math.ceil(clients / n)
    return Row(
        nodes=n,
        size=size,
        params=params,
        clients=clients,
        partial_sums=partial,
        rounds_measured=measured,
        digest=result.weights_digest,
        worker_nodes=len({w["node_id"] for w in workers}),
        coordinator_bytes_in=mean("coordinator_bytes_in"),
        bytes_up=mean("bytes_up"),
        head_received=delta[0],
        head_sent=sent,
        node_received=delta[1:],
        derived_head_received=(n * 2 * model if partial else clients * model),
        derived_node_received=model,
        coordinator_cpu_s=(cpu1[0] - cpu0[0]) / measured,
        head_raylet_cpu_s=(cpu1[1] - cpu0[1]) / measured,
        round_wall_s=mean("round_wall_s"),
        round_wait_s=mean("round_wait_s"),
        server_wall_s=mean("server_wall_s"),
        reduce_wall_s=mean("reduce_wall_s"),
        round_compute_s=mean("round_compute_s"),
        round_compute_min_s=mean("round_compute_min_s"),
        client_s=mean("round_compute_s") / busiest,
    )


# --------------------------------------------------------------------------- fits
FEATURES = ("c0", "c_update", "c_byte", "c_model")


def features(clients: float, bytes_in: float, params: float) -> list[float]:
    return [1.0, clients, bytes_in, 4.0 * params]


def fit(rows: list[Row]) -> dict[str, float]:
    """Non-negative least squares of the coordinator's serial seconds on ``FEATURES``, each
    row weighted by 1/s (relative errors: small and large models count alike)."""
    from scipy.optimize import nnls

    x = np.array([features(r.clients, r.coordinator_bytes_in, r.params) for r in rows])
    y = np.array([r.coordinator_cpu_s for r in rows])
    w = 1.0 / np.maximum(y, 1e-4)
    scale = np.maximum(np.abs(x).max(axis=0), 1e-30)
    coef, _ = nnls(x / scale * w[:, None], y * w)
    return dict(zip(FEATURES, (coef / scale).tolist(), strict=True))


def predict(c: dict[str, float], clients: float, bytes_in: float, params: float) -> float:
    return float(np.dot([c[k] for k in FEATURES], features(clients, bytes_in, params)))


def fit_reducer(rows: list[Row]) -> dict[str, float]:
    """The busiest node's reducer seconds against the bytes of deltas it summed."""
    from scipy.optimize import nnls

    x = np.array([[1.0, math.ceil(r.clients / r.nodes) * 4.0 * r.params] for r in rows])
    y = np.array([r.reduce_wall_s for r in rows])
    w = 1.0 / np.maximum(y, 1e-4)
    scale = np.maximum(x.max(axis=0), 1e-30)
    coef, _ = nnls(x / scale * w[:, None], y * w)
    r0, r_byte = (coef / scale).tolist()
    return {"r0": r0, "r_byte": r_byte}


# --------------------------------------------------------------------------- the projection
def project(
    params: int,
    partial: bool,
    coord: dict[str, float],
    reducer: dict[str, float],
    nodes: int,
    workers: int,
    clients: int,
    client_s: float,
    nic: float,
) -> dict[str, Any]:
    """A synchronous round's stages, one after another (overlap could only shorten it): the
    version out to every node, the clients on the GPUs, the reducers (partial sums), the bytes
    into the coordinator's node, the coordinator's serial work."""
    model = 4.0 * params
    bytes_in = nodes * 2 * model if partial else clients * model
    stages = {
        "broadcast": nodes * model / nic,
        "clients": math.ceil(clients / workers) * client_s,
        "reducers": (
            reducer["r0"] + reducer["r_byte"] * math.ceil(clients / nodes) * model
            if partial
            else 0.0
        ),
        "ingress": bytes_in / nic,
        "coordinator": predict(coord, clients, bytes_in, params),
    }
    serial = stages["coordinator"] + stages["ingress"]
    # each node's store holds its deltas until the round's sum (partial sums); the coordinator
    # holds every update of the round until it sums them (per update: FedAvg sums at round end)
    held = math.ceil(clients / nodes) * model if partial else clients * model
    return {
        "bytes_in": bytes_in,
        **{f"{k}_s": v for k, v in stages.items()},
        "round_s": sum(stages.values()),
        "limit": max(stages, key=stages.__getitem__),
        "workers_at_saturation": clients * client_s / serial,
        # below this a client's seconds, the coordinator's serial part outweighs the clients'
        "client_s_breakeven": serial * workers / clients,
        "held_bytes": held,
    }


# --------------------------------------------------------------------------- printing
def _b(x: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.0f} B"


def _s(x: float) -> str:
    if x >= 1:
        return f"{x:.3g} s"
    return f"{x * 1e3:.3g} ms"


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print(flush=True)


def print_measured(rows: list[Row], one_node: dict[tuple[str, int], float]) -> None:
    print("== measured, per round (mean of the rounds between warm-up and evaluation) ==")
    print("bytes: raysim = coordinator_bytes_in (raysim's counter); head/nodes = Ray's object-")
    print("manager counters (measured; objects < 100 KiB travel in RPCs, uncounted); derived =")
    print("what the sizes say should cross (clients × 4P whole, or nodes × 8P as partials)")
    headers = ["nodes", "params", "clients", "sums", "raysim in", "head rcvd", "derived",
               "node rcvd (each)", "derived", "coord cpu", "raylet cpu", "server", "reduce",
               "busiest wkr", "round wall", "serial %", "W*", "max speedup"]  # fmt: skip
    out = []
    for r in rows:
        s = r.coordinator_cpu_s
        p = r.clients * one_node.get((r.size, r.clients), r.client_s)
        out.append([
            str(r.nodes), f"{r.params:.3g}", str(r.clients),
            "partial" if r.partial_sums else "whole",
            _b(r.coordinator_bytes_in), _b(r.head_received), _b(r.derived_head_received),
            " ".join(_b(x) for x in r.node_received), _b(r.derived_node_received),
            _s(s), _s(r.head_raylet_cpu_s), _s(r.server_wall_s),
            _s(r.reduce_wall_s) if r.partial_sums else "-", _s(r.round_compute_s),
            _s(r.round_wall_s), f"{100 * s / (s + p):.1f}", f"{p / s:.3g}",
            f"{(s + p) / s:.3g}",
        ])  # fmt: skip
    table(headers, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small model, 1 and 2 nodes")
    parser.add_argument("--nodes", type=int, default=3, help="the most nodes measured")
    parser.add_argument("--rounds", type=int, default=0, help="measured rounds (0: by size)")
    parser.add_argument("--client-s", type=float, default=0.5,
                        help="the projection's seconds for one client's update on a GPU")  # fmt: skip
    parser.add_argument("--nic-gbps", type=float, default=100.0,
                        help="the projection's network bandwidth into or out of a node")  # fmt: skip
    parser.add_argument("--clients", type=int, default=1000, help="the projection's clients")
    parser.add_argument("--out", type=Path, default=None, help="a JSON of every row")
    args = parser.parse_args()
    grid = QUICK if args.quick else FULL
    max_nodes = 2 if args.quick else args.nodes
    print(f"machine={machine()}", flush=True)
    load = os.getloadavg()[0]
    print(f"load_average_1min_at_start={load:.2f}", flush=True)
    started = time.perf_counter()
    rows: list[Row] = []
    with loopback(head_store=2_500_000_000) as cluster:
        for n in range(1, max_nodes + 1):
            cluster.add_node(1_500_000_000)
            for size, clients in grid:
                measured = args.rounds or (2 if args.quick else 8 if size in ("1e4", "1e5") else 3)
                for partial in (False, True):
                    row = run_one(cluster, size, clients, partial, measured)
                    rows.append(row)
                    print(
                        f"ran nodes={n} params={row.params} clients={clients} "
                        f"partial_sums={partial}: round_wall={row.round_wall_s:.3f} s "
                        f"coordinator_cpu={row.coordinator_cpu_s:.4f} s "
                        f"bytes_in={row.coordinator_bytes_in:.0f}",
                        flush=True,
                    )
    took = time.perf_counter() - started
    print(f"measured_in_s={took:.0f} load_average_1min_at_end={os.getloadavg()[0]:.2f}")

    # checks the output states: the same bits either way; partials within nodes × 2 × model
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        same = a.digest == b.digest
        print(
            f"check nodes={a.nodes} params={a.params} clients={a.clients}: "
            f"same_bits={same} worker_nodes={b.worker_nodes} "
            f"partial_bytes_in={b.coordinator_bytes_in:.0f} "
            f"nodes_x_2_x_model={b.nodes * 2 * 4 * b.params} "
            f"whole_bytes_in={a.coordinator_bytes_in:.0f} clients_x_model={a.clients * 4 * a.params}"
        )
    print()
    one_node = {(r.size, r.clients): r.client_s for r in rows if r.nodes == 1}
    print_measured(rows, one_node)
    print("coord cpu: the coordinator process's CPU seconds a round (its serial work); raylet")
    print("cpu: the head's raylet (objects pulled to the coordinator's node). W* = workers")
    print("before the coordinator saturates = p / s, with s = coord cpu and p = clients × one")
    print("client's seconds on the 1-node run; max speedup = (s + p) / s; serial % = s / (s + p).")
    print()

    whole = fit([r for r in rows if not r.partial_sums])
    part = fit([r for r in rows if r.partial_sums])
    reducer = fit_reducer([r for r in rows if r.partial_sums])
    print("== fitted: the coordinator's serial seconds a round (NNLS, relative errors) ==")
    print("s = c0 + c_update × clients + c_byte × bytes_in + c_model × 4 × params")
    for name, c in (("whole", whole), ("partial", part)):
        print(
            f"fit.{name}: c0={_s(c['c0'])} c_update={c['c_update'] * 1e6:.3g} µs "
            f"c_byte={c['c_byte'] * 1e9:.3g} ns/B ({1 / max(c['c_byte'], 1e-30) / 1e9:.3g} GB/s) "
            f"c_model={c['c_model'] * 1e9:.3g} ns/B"
        )
    print(
        f"fit.reducer: r0={_s(reducer['r0'])} r_byte={reducer['r_byte'] * 1e9:.3g} ns/B "
        f"({1 / max(reducer['r_byte'], 1e-30) / 1e9:.3g} GB/s of deltas summed)"
    )
    for name, c, sub in (("whole", whole, False), ("partial", part, True)):
        errs = [
            predict(c, r.clients, r.coordinator_bytes_in, r.params) / r.coordinator_cpu_s - 1
            for r in rows
            if r.partial_sums == sub
        ]
        print(f"fit.{name}.residual: median |rel| {np.median(np.abs(errs)):.2f}, "
              f"max |rel| {np.max(np.abs(errs)):.2f}")  # fmt: skip
    print()

    nodes, workers, nic = 8, 64, args.nic_gbps * 1e9 / 8
    print(
        f"== PROJECTION (not a measurement): one round on {nodes} nodes × 8 GPUs = {workers} "
        f"workers, {args.clients} clients a round =="
    )
    print(
        f"assumed: a client's update takes --client-s={args.client_s} s on a GPU; each node's "
        f"link moves --nic-gbps={args.nic_gbps:g} Gb/s; the coordinator's and reducers' "
        "per-byte and per-update costs are this machine's (fitted above); stages run one after "
        "another"
    )
    projected = []
    out = []
    for name, params in PROJECTED.items():
        for partial, c in ((False, whole), (True, part)):
            p = project(params, partial, c, reducer, nodes, workers, args.clients,
                        args.client_s, nic)  # fmt: skip
            projected.append({"model": name, "params": params, "partial_sums": partial, **p})
            out.append([
                name, f"{params:.3g}", "partial" if partial else "whole", _b(p["bytes_in"]),
                _s(p["ingress_s"]), _s(p["coordinator_s"]),
                _s(p["reducers_s"]) if partial else "-", _s(p["clients_s"]),
                _s(p["broadcast_s"]), _s(p["round_s"]), p["limit"],
                f"{p['workers_at_saturation']:.3g}", _s(p["client_s_breakeven"]),
                _b(p["held_bytes"]),
            ])  # fmt: skip
    table(
        ["model", "params", "sums", "coord in", "ingress", "coord serial", "reducers",
         "clients", "broadcast", "round", "limit", "W*", "client s below which coord limits",
         "held (coord | a node)"],
        out,
    )  # fmt: skip
    print("ingress = coord in / link; W* = clients × client s / (coord serial + ingress);")
    print("held: what must sit in memory until the round's sum: every update on the coordinator")
    print("(whole), a node's share of them in its object store (partial).")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "load_average_1min_at_start": load,
                    "measured": [asdict(r) for r in rows],
                    "fit": {"whole": whole, "partial": part, "reducer": reducer},
                    "projection": {
                        "nodes": nodes, "workers": workers, "clients": args.clients,
                        "client_s": args.client_s, "nic_gbps": args.nic_gbps, "rows": projected,
                    },
                },
                indent=1,
            )  # fmt: skip
        )
        print(f"out={args.out}")


if __name__ == "__main__":
    main()
