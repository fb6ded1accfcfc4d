"""raysim's quickstart workload in Flower 1.42's simulation engine, for benchmarking.

    benchmarks/peers/.venvs/flower/bin/python benchmarks/peers/flower_quickstart.py \
        --data benchmarks/peers/.data/quickstart.npz [--rounds 30]

Prints ``round=K t=EPOCH_SECONDS`` after each round (from the strategy's ``evaluate_fn``, which
``Strategy.start`` calls after every round) and ``accuracy=A`` (the last round's).

Mapping of the workload onto Flower (Message API, ``flwr.simulation.run_simulation``):
- 100 virtual SuperNodes; node ``partition-id`` j trains on client j of the exported npz, read
  when the node is sampled (the ClientApp is shipped to a Ray actor with every message).
- server: ``flwr.serverapp.strategy.FedAvg`` with ``fraction_train=0.1`` (10 nodes a round,
  ``random.sample`` without replacement; seeded here, but node ids are random per run, so the
  clients drawn still differ between runs), averaging the returned models weighted by each
  reply's ``num-examples``; ``fraction_evaluate=0`` (no federated evaluation) and central
  evaluation of the global model on the test set through ``evaluate_fn``.
- local training: 5 epochs, batch 10, reshuffled each epoch, SGD lr 0.1 momentum 0.5, a new
  optimizer per client and round.
- backend: Flower's default (Ray; 2 CPUs and no GPU per ClientApp, so one actor on a 2-core box).
- threading: torch's default; in the Ray actor that is Ray's OMP_NUM_THREADS (the actor's CPUs).
- telemetry: Flower's and Ray's usage reporting are switched off (the machine has no internet).
"""

from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # read when flwr is imported
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

SEED = 0
NUM_CLIENTS = 100
EPOCHS, BATCH, LR, MOMENTUM = 5, 10, 0.1, 0.5


def make_model() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def local_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> None:
    """Plain SGD epochs over ``(x, y)`` in minibatches, reshuffled every epoch."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    model.train()
    for _ in range(EPOCHS):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), BATCH):
            idx = order[start : start + BATCH]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


def build_apps(data: str, rounds: int, final: dict[str, float]) -> tuple[ServerApp, ClientApp]:
    """The ServerApp (FedAvg + central evaluation) and ClientApp (local training) closures;
    ``final['accuracy']`` receives the last round's central accuracy."""
    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        with np.load(data) as npz:
            lo, hi = npz["offsets"][cid : cid + 2]
            x, y = torch.from_numpy(npz["x"][lo:hi]), torch.from_numpy(npz["y"][lo:hi])
        model = make_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        server_round = int(msg.content["config"]["server-round"])
        local_train(model, x, y, seed=SEED + 1000 * server_round + cid)
        reply = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord({"num-examples": len(y)}),
            }
        )
        return Message(content=reply, reply_to=msg)

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        random.seed(SEED)  # FedAvg samples nodes with random.sample
        torch.manual_seed(SEED)
        with np.load(data) as npz:
            x_test, y_test = torch.from_numpy(npz["x_test"]), torch.from_numpy(npz["y_test"])
        model = make_model()

        @torch.no_grad()
        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round == 0:
                return None  # Flower also calls it before round 1; the workload does not
            model.load_state_dict(arrays.to_torch_state_dict())
            model.eval()
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
            final["accuracy"] = accuracy
            print(f"round={server_round} t={time.time()}", flush=True)
            return MetricRecord({"accuracy": accuracy})

        strategy = FedAvg(fraction_train=0.1, fraction_evaluate=0.0)
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=rounds,
            train_config=ConfigRecord(),
            evaluate_fn=evaluate,
        )

    return server_app, client_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="npz written by export.py")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()

    final = {"accuracy": float("nan")}
    server_app, client_app = build_apps(os.path.abspath(args.data), args.rounds, final)
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=NUM_CLIENTS)
    print(f"accuracy={final['accuracy']}", flush=True)


if __name__ == "__main__":
    main()
