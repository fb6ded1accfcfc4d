"""``transport``: one request and its answer between two actors, by plain call and through a
compiled graph, as ``workers.transport`` sends a round's batch.

The answer is ten updates of the quickstart's MLP (27 K float32 each, about 1 MB, as pickled
bytes: what ``Worker.serve`` returns); the request carries the model's weights. Both sides run
from one coordinator-like actor on one private Ray:

- ``call``: ``ray.put`` of the weights, then an actor call that returns the answer through the
  object store (the path before ``workers.transport``);
- ``link``: ``raysim.actors.compiled.WorkerLink`` (the graph raysim builds), the weights inside
  the request.

Last lines: the median milliseconds per request of each, over ``--repeats`` interleaved blocks of
``--requests``, and ``link_vs_call``.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time

import numpy as np
import ray
from common import machine, report

from raysim.actors.compiled import WorkerLink
from raysim.launch.session import ensure_ray

PARAMS, CLIENTS = 27_000, 10


@ray.remote
class Echo:
    """Stands in for a worker: ten updates back for each request, computed from the weights."""

    def serve(self, request):
        if request is None:
            return None
        weights = request[1]
        if isinstance(weights, ray.ObjectRef):  # as Worker.serve resolves a version's ref
            weights = ray.get(weights)
        return pickle.dumps([weights + i for i in range(CLIENTS)])

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


@ray.remote
class Caller:
    """Stands in for the coordinator."""

    def __init__(self, echo) -> None:
        self.echo = echo
        self.link = WorkerLink(echo, ray.get_runtime_context().get_node_id())
        self.weights = np.random.default_rng(0).random(PARAMS, dtype=np.float32)

    def ready(self) -> bool:
        deadline = time.monotonic() + 60
        while not (self.link.ready or self.link.failed) and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.link.ready

    def block(self, how: str, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            if how == "call":
                ref = ray.put(self.weights)
                pickle.loads(ray.get(self.echo.serve.remote(("train", ref))))
            else:
                pickle.loads(self.link.fetch(self.link.execute(("train", self.weights))))
        return (time.perf_counter() - t0) / n * 1e3

    def close(self) -> None:
        self.link.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    ensure_ray(num_cpus=2)
    caller = Caller.remote(Echo.remote())
    if not ray.get(caller.ready.remote()):
        raise SystemExit("the compiled graph did not come up")
    ms: dict[str, list[float]] = {"call": [], "link": []}
    for _ in range(args.repeats):
        for how in ms:
            ms[how].append(ray.get(caller.block.remote(how, args.requests)))
    ray.get(caller.close.remote())
    ray.shutdown()
    med = {how: statistics.median(v) for how, v in ms.items()}
    report("config", params=PARAMS, clients=CLIENTS, requests=args.requests, repeats=args.repeats)
    for how, v in ms.items():
        report(how, ms_each=" ".join(f"{x:.3f}" for x in v), ms=med[how])
    report(link_vs_call=med["link"] / med["call"])


if __name__ == "__main__":
    main()
