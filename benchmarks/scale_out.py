"""``scale_out``: what a round costs the coordinator as nodes are added, with every update sent
whole (``workers.partial_sums=false``, before) and with one partial sum per node (``true``,
after), and where a round on 8 nodes × 8 GPUs would be limited.

A loopback Ray cluster of separate ``ray start`` processes with token authentication, as the
cluster tests start (``tests/loopback.py``): a head with no CPU (the driver and the coordinator
run there, as on a real cluster: the coordinator is pinned to it, as a tracking store on the
driver's node would pin it), and 1, 2 then 3 nodes of one CPU each, one worker each
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
  RPCs and are not counted there (a 10^4-parameter model's partials);
- **measured** here: the coordinator's serial seconds, the CPU seconds (all its threads,
  ``/proc/PID/task/*/schedstat``) of the coordinator's process over those rounds, read by the
  driver; the head's raylet (which receives the objects pulled to the coordinator's node) apart.

Every node shares this machine's cores: on a machine with fewer cores than nodes + 1, the
workers' seconds of a multi-node run include waiting for a core, so the client seconds of the
Amdahl bound come from the 1-node run.
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
import shutil
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
FULL = [("1e4", 40), ("1e4", 160), ("1e5", 40), ("1e6", 40), ("4.3e6", 40), ("1e7", 20)]
QUICK = [("1e4", 40)]
#: rounds measured by size (``--quick``: half), besides the warm-up round and the last one
MEASURED_ROUNDS = {"1e4": 8, "1e5": 8, "1e6": 4, "4.3e6": 2, "1e7": 2}
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
    from raysim.launch.private_ray import PRIVATE_RAY_ENV, private_ray_auth

    private_ray_auth()  # this process's token: the cluster's processes and this driver share it
    temp = Path(tempfile.mkdtemp(prefix="rso", dir="/tmp"))  # Ray's socket paths stay short
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k.startswith("RAY_AUTH")
    }
    env.update(PRIVATE_RAY_ENV)
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
        shutil.rmtree(temp, ignore_errors=True)


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
    """Every node's counters once three reads 0.5 s apart agree (Ray refreshes them every
    0.5 s here: ``RAY_metrics_report_interval_ms``)."""
    reads = [[received_bytes(n) for n in nodes]]
    for _ in range(40):
        time.sleep(0.5)
        reads.append([received_bytes(n) for n in nodes])
        if len(reads) >= 3 and reads[-1] == reads[-2] == reads[-3]:
            break
    return reads[-1]


def process_in(root: int, title: str) -> Any:
    """The one process under ``root`` whose name or Ray title (``ray::Coordinator``) is
    ``title``."""
    import psutil

    def named(p: Any) -> bool:
        try:
            first = p.cmdline()[0].strip()
            return first == title or first.endswith(f"/{title}")
        except (psutil.Error, IndexError):
            return False

    found = [p for p in psutil.Process(root).children(recursive=True) if named(p)]
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} processes {title!r} under the head, not one")
    return found[0]


def cpu_s(proc: Any) -> float:
    """A process's CPU seconds so far, all its threads (``/proc/PID/task/*/schedstat``: in
    nanoseconds, where ``cpu_times`` counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended as it was read
            continue
    return total / 1e9


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


def run_one(cluster: Loopback, size: str, clients: int, partial: bool, measured: int) -> Row:
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
        raylet = process_in(cluster.head.proc.pid, "raylet")
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
    """The busiest node's reducer seconds against the bytes of deltas it summed (one reducer a
    node here: a node of one CPU sums its deltas in one slice, ``raysim.actors.reduce``)."""
    from scipy.optimize import nnls

    x = np.array([[1.0, math.ceil(r.clients / r.nodes) * 4.0 * r.params] for r in rows])
    y = np.array([r.reduce_wall_s for r in rows])
    w = 1.0 / np.maximum(y, 1e-4)
    scale = np.maximum(x.max(axis=0), 1e-30)
    coef, _ = nnls(x / scale * w[:, None], y * w)
    r0, r_byte = (coef / scale).tolist()
    return {"r0": r0, "r_byte": r_byte}


# --------------------------------------------------------------------------- the projection
@dataclass
class Assumed:
    """What the projection takes as given, not measured here."""

    nodes: int = 8
    gpus: int = 8  # a node's GPUs: one worker each
    clients: int = 1000  # a round's
    client_s: float = 0.5  # one client's update on a GPU
    nic_gbps: float = 100.0  # each node's link, each way
    store_gb: float = 200.0  # each node's object store (Ray's default: 30 % of its memory)
    node_cpus: int = 64  # each node's CPUs: how many reducers sum its slices side by side

    @property
    def workers(self) -> int:
        return self.nodes * self.gpus

    @property
    def nic(self) -> float:
        return self.nic_gbps * 1e9 / 8


def project(
    params: int,
    partial: bool,
    coord: dict[str, float],
    reducer: dict[str, float],
    merge_byte: float,
    a: Assumed,
) -> dict[str, Any]:
    """A synchronous round's stages, one after another (overlap could only shorten it): the
    version out to every node, the clients on the GPUs, the reducers (partial sums), the bytes
    into the coordinator's node, the coordinator's serial work."""
    from raysim.actors.reduce import MAX_REDUCERS, MIN_SLICE

    model = 4.0 * params
    share = math.ceil(a.clients / a.nodes)  # a node's updates
    bytes_in = a.nodes * 2 * model if partial else a.clients * model
    # a node's deltas in k slices, summed side by side, then merged on the node by the first
    # reducer: k int64 partials added, at the coordinator's measured cost of adding one
    k = max(1, min(MAX_REDUCERS, a.node_cpus, share // MIN_SLICE))
    slices = reducer["r0"] + reducer["r_byte"] * math.ceil(share / k) * model
    merge = merge_byte * k * 2 * model if k > 1 else 0.0
    stages = {
        "broadcast": a.nodes * model / a.nic,  # at most: a node may pull from another
        "clients": math.ceil(a.clients / a.workers) * a.client_s,
        "reducers": slices + merge if partial else 0.0,
        "ingress": bytes_in / a.nic,
        "coordinator": predict(coord, a.clients, bytes_in, params),
    }
    serial = stages["coordinator"] + stages["ingress"]
    # until the round's sum, every update waits on the coordinator's node (whole: FedAvg sums
    # at the round's end) or a node's share of them in its object store (partial sums)
    held = share * model if partial else a.clients * model
    limit = max(stages, key=stages.__getitem__)
    if held > a.store_gb * 1e9:
        limit = f"memory ({'a node' if partial else 'coordinator'} holds {_b(held)})"
    return {
        "bytes_in": bytes_in,
        **{f"{k}_s": v for k, v in stages.items()},
        "round_s": sum(stages.values()),
        "limit": limit,
        "workers_at_saturation": a.clients * a.client_s / serial,
        # below this a client's seconds, the coordinator's serial part outweighs the clients'
        "client_s_breakeven": serial * a.workers / a.clients,
        "held_bytes": held,
        "reducers_a_node": k if partial else 0,
    }


# --------------------------------------------------------------------------- printing
def _b(x: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.0f} B"


def _s(x: float) -> str:
    return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.3g} ms"


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print(flush=True)


def amdahl(r: Row, client_s: float) -> tuple[float, float, float]:
    """(serial share, workers at saturation, the most speed-up) of a row: s its coordinator's
    CPU seconds, p its clients × ``client_s``."""
    s, p = r.coordinator_cpu_s, r.clients * client_s
    return s / (s + p), p / s, (s + p) / s


def print_bytes(rows: list[Row]) -> None:
    print("== bytes a round: measured (raysim's and Ray's counters) against derived from sizes ==")
    headers = ["nodes", "params", "clients", "sums", "coord in (raysim)", "head rcvd (Ray)",
               "derived", "head sent (Ray)", "derived", "each node rcvd (Ray)", "derived",
               "bytes_up"]  # fmt: skip
    out = []
    for r in rows:
        inline = r.partial_sums and 8 * r.params < INLINE
        out.append([
            str(r.nodes), f"{r.params:.3g}", str(r.clients),
            "partial" if r.partial_sums else "whole",
            _b(r.coordinator_bytes_in), _b(r.head_received) + (" *" if inline else ""),
            _b(r.derived_head_received), _b(r.head_sent), f"≤ {_b(r.nodes * 4 * r.params)}",
            " ".join(_b(x) for x in r.node_received), _b(r.derived_node_received),
            _b(r.bytes_up),
        ])  # fmt: skip
    table(headers, out)
    print("coord in: coordinator_bytes_in, what reached the coordinator's process; head/node:")
    print("ray_object_manager_bytes of each node (Received; sent: PushedFromLocalPlasma);")
    print("derived: clients × 4·params (whole) or nodes × 8·params (int64 partials) into the")
    print("head, the version (4·params) into each worker node, at most one version a node out of")
    print("the head (a node may pull it from another); Ray's counts add ~250 B an object. *")
    print("objects under 100 KiB travel inside Ray's RPCs, uncounted by the object manager.")
    print()


def print_seconds(rows: list[Row], one_node: dict[tuple[str, int], float]) -> None:
    print("== seconds a round, and the Amdahl bound ==")
    headers = ["nodes", "params", "clients", "sums", "coord cpu (serial)", "head raylet cpu",
               "server_wall", "reduce_wall", "busiest worker", "least busy", "round_wall",
               "serial %", "W*", "max speed-up"]  # fmt: skip
    out = []
    for r in rows:
        share, w, most = amdahl(r, one_node.get((r.size, r.clients), r.client_s))
        out.append([
            str(r.nodes), f"{r.params:.3g}", str(r.clients),
            "partial" if r.partial_sums else "whole",
            _s(r.coordinator_cpu_s), _s(r.head_raylet_cpu_s), _s(r.server_wall_s),
            _s(r.reduce_wall_s) if r.partial_sums else "-", _s(r.round_compute_s),
            _s(r.round_compute_min_s), _s(r.round_wall_s), f"{100 * share:.1f}", f"{w:.3g}",
            f"{most:.3g}",
        ])  # fmt: skip
    table(headers, out)
    print("coord cpu: CPU seconds of the coordinator's process (all threads), its serial work;")
    print("head raylet cpu: the head's raylet, which receives what is pulled to the coordinator's")
    print("node; server_wall_s includes waiting for the reducers; busiest/least busy worker:")
    print("round_compute_s/round_compute_min_s. Amdahl, with s = coord cpu and p = clients × one")
    print("client's seconds (busiest worker's seconds per client on the 1-node run, where the")
    print("worker has a core to itself): serial % = s/(s+p); W* = p/s, the workers before the")
    print("coordinator saturates (each one's share of the client work down to s); max speed-up")
    print("= (s+p)/s, the bound however many workers.")
    print()


def print_before_after(rows: list[Row], one_node: dict[tuple[str, int], float]) -> None:
    print("== before (partial_sums=false) and after (true) ==")
    headers = ["nodes", "params", "clients", "coord in", "coord cpu", "serial %", "W*",
               "max speed-up", "round_wall", "same bits"]  # fmt: skip
    out = []
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        c = one_node.get((a.size, a.clients), a.client_s)
        (sa, wa, ma), (sb, wb, mb) = amdahl(a, c), amdahl(b, c)
        out.append([
            str(a.nodes), f"{a.params:.3g}", str(a.clients),
            f"{_b(a.coordinator_bytes_in)} → {_b(b.coordinator_bytes_in)}",
            f"{_s(a.coordinator_cpu_s)} → {_s(b.coordinator_cpu_s)}",
            f"{100 * sa:.1f} → {100 * sb:.1f}", f"{wa:.3g} → {wb:.3g}", f"{ma:.3g} → {mb:.3g}",
            f"{_s(a.round_wall_s)} → {_s(b.round_wall_s)}", str(a.digest == b.digest),
        ])  # fmt: skip
    table(headers, out)


def print_fits(whole: dict, part: dict, reducer: dict, rows: list[Row]) -> None:
    print("== fitted: the coordinator's serial seconds a round (NNLS, relative errors) ==")
    print("s = c0 + c_update × clients + c_byte × coordinator bytes in + c_model × 4·params")
    for name, c, sub in (("whole", whole, False), ("partial", part, True)):
        errs = [
            predict(c, r.clients, r.coordinator_bytes_in, r.params) / r.coordinator_cpu_s - 1
            for r in rows
            if r.partial_sums == sub
        ]
        print(
            f"fit.{name}: c0={_s(c['c0'])} c_update={c['c_update'] * 1e6:.3g} µs "
            f"c_byte={c['c_byte'] * 1e9:.3g} ns/B c_model={c['c_model'] * 1e9:.3g} ns/B; "
            f"|relative residual| median {np.median(np.abs(errs)):.2f} max "
            f"{np.max(np.abs(errs)):.2f} over {len(errs)} runs"
        )
    print(
        f"fit.reducer (busiest node's seconds = r0 + r_byte × bytes of deltas it summed): "
        f"r0={_s(reducer['r0'])} r_byte={reducer['r_byte'] * 1e9:.3g} ns/B "
        f"({1 / max(reducer['r_byte'], 1e-30) / 1e9:.3g} GB/s)"
    )
    print()


def print_projection(projected: list[dict[str, Any]], a: Assumed) -> None:
    print(
        f"== PROJECTION, not a measurement: one round on {a.nodes} nodes × {a.gpus} GPUs = "
        f"{a.workers} workers, {a.clients} clients a round =="
    )
    print(
        f"assumed: a client's update takes {a.client_s:g} s on a GPU (--client-s); each node's "
        f"link moves {a.nic_gbps:g} Gb/s each way (--nic-gbps); a node's object store holds "
        f"{a.store_gb:g} GB (--store-gb) and has {a.node_cpus} CPUs (--node-cpus), one reducer "
        "a CPU up to raysim's maximum; the coordinator's and reducers' costs are this machine's, "
        "fitted above; a round's stages run one after another"
    )
    out = [
        [
            p["model"], f"{p['params']:.3g}", "partial" if p["partial_sums"] else "whole",
            _b(p["bytes_in"]), _s(p["ingress_s"]), _s(p["coordinator_s"]),
            f"{_s(p['reducers_s'])} ({p['reducers_a_node']})" if p["partial_sums"] else "-",
            _s(p["clients_s"]),
            _s(p["broadcast_s"]), _s(p["round_s"]), f"{p['workers_at_saturation']:.3g}",
            _s(p["client_s_breakeven"]), _b(p["held_bytes"]), p["limit"],
        ]
        for p in projected
    ]  # fmt: skip
    table(
        ["model", "params", "sums", "coord in", "ingress", "coord serial", "reducers (k)",
         "clients", "broadcast", "round", "W*", "coord limits below", "held", "limit"],
        out,
    )  # fmt: skip
    print("ingress = coord in / link; reducers (k): a node's sum of its share of updates, in k")
    print("slices side by side, their k int64 partials then merged on the node at the cost the")
    print("coordinator's fit gives a byte of partial (c_byte, partial);")
    print("W* = clients × client s / (coord serial + ingress), the workers before the")
    print("coordinator's node saturates; coord limits below: the client seconds under which the")
    print("coordinator's serial part outweighs a worker's share of the clients; held: what waits")
    print("in memory for the round's sum (whole: every update, on the coordinator's node; partial:")
    print("a node's share, in its object store); limit: the longest stage, or memory where held")
    print("exceeds a node's store.")
    print()
    for partial in (False, True):
        limits = ", ".join(
            f"{p['model']}: {p['limit']}" for p in projected if p["partial_sums"] == partial
        )
        print(f"projected_limit.{'partial' if partial else 'whole'}: {limits}")
    print()


def measure(grid: list[tuple[str, int]], max_nodes: int, rounds: int, quick: bool) -> list[Row]:
    """Every run of ``grid`` on 1 to ``max_nodes`` nodes, each setting back to back."""
    rows: list[Row] = []
    with loopback(head_store=2_500_000_000) as cluster:
        for n in range(1, max_nodes + 1):
            cluster.add_node(1_500_000_000)
            for size, clients in grid:
                measured = rounds or MEASURED_ROUNDS[size] // (2 if quick else 1)
                for partial in (False, True):
                    t0 = time.perf_counter()
                    row = run_one(cluster, size, clients, partial, measured)
                    rows.append(row)
                    print(
                        f"ran nodes={n} params={row.params} clients={clients} "
                        f"partial_sums={str(partial).lower()} in {time.perf_counter() - t0:.0f} s: "
                        f"round_wall={row.round_wall_s:.3f} s "
                        f"coordinator_cpu={row.coordinator_cpu_s:.4f} s "
                        f"coordinator_bytes_in={row.coordinator_bytes_in:.0f}",
                        flush=True,
                    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="one small model, 1 and 2 nodes")
    add("--nodes", type=int, default=3, help="the most nodes measured")
    add("--grid", default="", help=f"SIZE:CLIENTS,... measured instead (sizes: {' '.join(HIDDEN)})")
    add("--rounds", type=int, default=0, help="measured rounds (0: by size)")
    add(
        "--from",
        dest="replay",
        type=Path,
        default=None,
        help="measure nothing: the rows of an earlier --out, fitted and projected again",
    )
    add(
        "--client-s",
        type=float,
        default=Assumed.client_s,
        help="projection: one client's update on a GPU, seconds",
    )
    add(
        "--nic-gbps",
        type=float,
        default=Assumed.nic_gbps,
        help="projection: a node's link, Gb/s each way",
    )
    add(
        "--store-gb",
        type=float,
        default=Assumed.store_gb,
        help="projection: a node's object store, GB",
    )
    add(
        "--node-cpus",
        type=int,
        default=Assumed.node_cpus,
        help="projection: a node's CPUs (its reducers: one a CPU, up to raysim's maximum)",
    )
    add("--clients", type=int, default=Assumed.clients, help="projection: clients a round")
    add("--out", type=Path, default=None, help="a JSON of every row")
    args = parser.parse_args()  # fmt: skip
    grid = QUICK if args.quick else FULL
    if args.grid:
        grid = [(a, int(b)) for a, b in (item.split(":") for item in args.grid.split(","))]
    if args.replay is not None:
        saved = json.loads(args.replay.read_text())
        where, load, took = saved["machine"], saved["load_average_1min_at_start"], None
        rows = [Row(**r) for r in saved["measured"]]
        print(f"machine={where} (measured there: rows from {args.replay})")
    else:
        where = machine()
        print(f"machine={where}", flush=True)
        load = os.getloadavg()[0]
        print(f"load_average_1min_at_start={load:.2f}", flush=True)
        started = time.perf_counter()
        rows = measure(grid, 2 if args.quick else args.nodes, args.rounds, args.quick)
        took = time.perf_counter() - started
        print(f"measured_in_s={took:.0f} load_average_1min_at_end={os.getloadavg()[0]:.2f}")
    print()

    # what the output claims, one line each: the same bits either way, the workers on as many
    # nodes, and the partials' bytes at most nodes × 2 × the model's (int64 against float32)
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        print(
            f"check nodes={a.nodes} params={a.params} clients={a.clients} "
            f"same_bits={a.digest == b.digest} worker_nodes={b.worker_nodes} "
            f"partial_bytes_in={b.coordinator_bytes_in:.0f} "
            f"nodes_x_2_x_model={b.nodes * 2 * 4 * b.params} "
            f"whole_bytes_in={a.coordinator_bytes_in:.0f} "
            f"clients_x_model={a.clients * 4 * a.params}"
        )
    print()
    one_node = {(r.size, r.clients): r.client_s for r in rows if r.nodes == 1}
    print_bytes(rows)
    print_seconds(rows, one_node)
    print_before_after(rows, one_node)

    whole = fit([r for r in rows if not r.partial_sums])
    part = fit([r for r in rows if r.partial_sums])
    reducer = fit_reducer([r for r in rows if r.partial_sums])
    if len(rows) < 2 * len(FEATURES) * 2:
        print(f"(only {len(rows)} runs: the fits and the projection below show the format only)")
    print_fits(whole, part, reducer, rows)
    assumed = Assumed(clients=args.clients, client_s=args.client_s, nic_gbps=args.nic_gbps,
                      store_gb=args.store_gb, node_cpus=args.node_cpus)  # fmt: skip
    projected = [
        {"model": name, "params": params, "partial_sums": partial,
         **project(params, partial, part if partial else whole, reducer, part["c_byte"],
                   assumed)}
        for name, params in PROJECTED.items()
        for partial in (False, True)
    ]  # fmt: skip
    print_projection(projected, assumed)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "machine": where,
                    "load_average_1min_at_start": load,
                    "measured_in_s": took,
                    "measured": [asdict(r) for r in rows],
                    "fit": {"whole": whole, "partial": part, "reducer": reducer},
                    "projection": {"assumed": asdict(assumed), "rows": projected},
                },
                indent=1,
            )
        )
        print(f"out={args.out}")


if __name__ == "__main__":
    main()
