"""The server's account of sample-level DP-SGD (``local.dp_sgd``): ε per client, an example of
its data the privacy unit.

Every DP-SGD step of client k samples b of its n_k examples without replacement (``local.sampling:
independent``) and releases one Gaussian mechanism on their clipped sum: dp-accounting's
``SampledWithoutReplacementDpEvent(n_k, b, GaussianDpEvent(z/2))`` under replace-one neighbours
(replacing one example moves the sum by up to 2C, so σ = z·C / 2C), the same analysis as the
user-level fixed-size schedule (``accounting.Schedule``). A client's steps over all its local
calls compose (each call starts from a model that is post-processing of earlier releases).

The run reports the worst client's ε as an upper bound: the RDP of the smallest n_k seen (the
largest sampling rate) times the most steps any client has taken. ε grows with both, so no
client's own ε exceeds it; it needs one RDP curve per new smallest n_k instead of one per client
(a curve costs about half a second; ``accounting.epsilon`` caches them). No Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raysim.errors import PrivacyError
from raysim.training.settings import DP_SGD_STEPS_METRIC as STEPS_METRIC


class SampleLevelLedger:
    """Each client's DP-SGD steps and data size, and the worst client's ε(δ) from them."""

    def __init__(self, batch_size: int, noise_multiplier: float, delta: float) -> None:
        self.batch_size, self.noise_multiplier, self.delta = batch_size, noise_multiplier, delta
        self.steps: dict[int, int] = {}
        self.smallest: int | None = None  # the smallest n_k of a client that took a step

    def record(self, client: int, num_samples: int, metrics: Mapping[str, float]) -> None:
        """A job of ``client`` (``num_samples`` examples) arrived with its train metrics."""
        if STEPS_METRIC not in metrics:
            raise PrivacyError(
                f"local.dp_sgd: client {client}'s update was trained without DP-SGD (its method "
                "trains outside raysim.training's local loop); set local.dp_sgd null for it"
            )
        taken = int(metrics[STEPS_METRIC])
        if taken <= 0:
            return
        self.steps[client] = self.steps.get(client, 0) + taken
        if self.smallest is None or num_samples < self.smallest:
            self.smallest = num_samples

    def epsilon(self) -> float:
        """An upper bound on every client's ε(δ) so far: 0 before any step, inf with z = 0."""
        from .accounting import Schedule, epsilon

        most = max(self.steps.values(), default=0)
        if self.smallest is None:
            return 0.0
        n = max(self.smallest, 1)
        schedule = Schedule(n, min(self.batch_size, n), "without_replacement")
        return epsilon(schedule, self.noise_multiplier, most, self.delta)

    def metrics(self) -> dict[str, float]:
        return {
            "dp_sgd_epsilon": self.epsilon(),
            "dp_sgd_delta": self.delta,
            "dp_sgd_noise_multiplier": self.noise_multiplier,
            "dp_sgd_max_steps": float(max(self.steps.values(), default=0)),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"steps": dict(self.steps), "smallest": self.smallest}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = {int(k): int(v) for k, v in state.get("steps", {}).items()}
        smallest = state.get("smallest")
        self.smallest = None if smallest is None else int(smallest)
