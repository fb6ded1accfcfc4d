"""raysim's quickstart workload in pfl-research 0.6.0 (Apple's ``pfl``), for benchmarking.

    benchmarks/peers/.venvs/pfl/bin/python benchmarks/peers/pfl_quickstart.py \
        --data benchmarks/peers/.data/quickstart.npz [--rounds 30]

Prints ``round=K t=EPOCH_SECONDS`` after each round (from pfl's after-central-iteration
hook, once the round's central evaluation is done) and ``accuracy=A`` (the last round's).

Mapping of the workload onto pfl:
- users: a ``FederatedDataset`` whose ``make_dataset_fn`` slices a user's rows out of the
  exported npz only when the user is sampled; the sampler draws 10 distinct users a round
  (pfl's ``get_user_sampler('random')`` draws with replacement, so a cohort could repeat a user).
- local training: pfl's own SGD loop (``FederatedAveraging.train_one_user``), 5 epochs, batch 10,
  SGD lr 0.1 momentum 0.5, a new optimizer per user; pfl's ``Dataset.iter`` yields batches in a
  fixed order, so the user dataset reshuffles on every pass.
- server: ``FederatedAveraging`` + ``SimulatedBackend`` with ``WeightByDatapoints`` (pfl's default
  weight is 1 per user, i.e. an unweighted mean) and a central SGD(lr=1) that adds the mean update.
- evaluation: ``CentralEvaluationCallback`` on the test set after every round; pfl's own skips
  round 1 and evaluates before training instead, which raysim does not do.
- threading: torch's default (pfl's source does not set it); one process, no pfl workers.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.central_evaluation import CentralEvaluationCallback
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.pytorch import PyTorchTensorDataset
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from torch import nn

SEED = 0
COHORT = 10  # clients per round
ACCURACY = "Central val | accuracy"  # CentralEvaluationCallback's default name for "accuracy"


class MLP(nn.Sequential):
    """The quickstart model, with the ``loss`` and ``metrics`` that ``PyTorchModel`` needs."""

    def __init__(self) -> None:
        super().__init__(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Weighted]:
        logits = self(x)
        return {
            "loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), len(y)),
            "accuracy": Weighted((logits.argmax(1) == y).sum().item(), len(y)),
        }


class ShuffledDataset(PyTorchTensorDataset):
    """A user's ``(x, y)`` tensors, batched in a fresh random order on every pass (epoch)."""

    def iter(self, batch_size: int | None):  # noqa: A003 (pfl's method name)
        x, y = self.raw_data
        if batch_size is None:
            yield [x, y]
            return
        order = torch.randperm(len(y))
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            yield [x[idx], y[idx]]


class CohortSampler:
    """pfl's ``user_sampler`` interface (``() -> user_id``): each run of ``cohort`` calls
    returns ``cohort`` distinct users, drawn uniformly without replacement."""

    def __init__(self, num_users: int, cohort: int, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._num_users, self._cohort = num_users, cohort
        self._pending: list[int] = []

    def __call__(self) -> int:
        if not self._pending:
            self._pending = self._rng.choice(self._num_users, self._cohort, replace=False).tolist()
        return self._pending.pop()


class RoundEvaluation(CentralEvaluationCallback):
    """pfl's central evaluation after every round (including the first), printing the round."""

    accuracy = float("nan")

    def on_train_begin(self, *, model: PyTorchModel) -> Metrics:
        return Metrics()  # no evaluation of the untrained model

    def after_central_iteration(
        self, aggregate_metrics: Metrics, model: PyTorchModel, *, central_iteration: int
    ) -> tuple[bool, Metrics]:
        stop, metrics = self._eval(model)  # the parent's evaluation, without its round-1 skip
        self.accuracy = metrics[ACCURACY].overall_value
        print(f"round={central_iteration + 1} t={time.time()}", flush=True)
        return stop, metrics


def federated_dataset(data: dict[str, np.ndarray]) -> FederatedDataset:
    """Users 0..J-1 of the exported split; a user's tensors are made when it is sampled."""
    x, y, offsets = data["x"], data["y"], data["offsets"]

    def make_user(user_id: int) -> ShuffledDataset:
        rows = slice(offsets[user_id], offsets[user_id + 1])
        return ShuffledDataset((torch.from_numpy(x[rows]), torch.from_numpy(y[rows])), user_id)

    return FederatedDataset(make_user, CohortSampler(len(offsets) - 1, COHORT, SEED))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="npz written by export.py")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()

    np.random.seed(SEED)
    torch.manual_seed(SEED)
    with np.load(args.data) as npz:
        data = {k: npz[k] for k in npz.files}
    test = PyTorchTensorDataset(tuple(torch.from_numpy(data[k]) for k in ("x_test", "y_test")))
    net = MLP()
    model = PyTorchModel(
        model=net,
        local_optimizer_create=partial(torch.optim.SGD, momentum=0.5),
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    backend = SimulatedBackend(
        training_data=federated_dataset(data),
        val_data=None,
        postprocessors=[WeightByDatapoints()],
    )
    evaluation = RoundEvaluation(test, model_eval_params=NNEvalHyperParams(local_batch_size=None))
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=args.rounds,
            # local before/after-training metrics of every user: not part of the workload
            # (iteration 0 % n == 0, so pfl still computes them once, in round 1)
            evaluation_frequency=args.rounds + 1,
            train_cohort_size=COHORT,
            val_cohort_size=0,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=5, local_learning_rate=0.1, local_batch_size=10
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[evaluation],
        send_metrics_to_platform=False,  # pfl's platform would print every metric each round
    )
    print(f"accuracy={evaluation.accuracy}", flush=True)


if __name__ == "__main__":
    main()
