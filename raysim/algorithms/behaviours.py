"""Built-in client behaviours (``hooks.clients``): attacks and faults as configuration.

- ``corrupt``: poison the update with NaN or Inf (what ``faults.corrupt_updates`` configures; the
  coordinator rejects such updates).
- ``label_shuffle``: the client randomly permutes the labels of its local data before training
  (fedbaf.md §4.4, the paper's untargeted attacker; next-token targets for a causal LM).
- ``scale_update``: the client multiplies its delta by a factor (update boosting).

Randomness comes from the job's seed through a named phase, so a behaviour never perturbs the
client's own training streams and results stay independent of the worker that ran the job.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from .base import ClientContext
from .hooks import BEHAVIOURS, BehaviourParams, ClientBehaviour, Hook


class CorruptParams(BehaviourParams):
    value: Literal["nan", "inf"] = "nan"


class Corrupt(ClientBehaviour):
    params: CorruptParams

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        delta = np.array(delta, copy=True)
        delta[0] = np.float32(self.params.value)
        return delta


class LabelShuffle(ClientBehaviour):
    def on_data(self, ctx: ClientContext, data: Any) -> Any:
        gen = torch.Generator().manual_seed(ctx.seed ^ 0x5A1F)
        if isinstance(data, dict):  # causal LM: shuffle the next-token targets among positions
            labels = data["labels"].clone()
            mask = labels != -100
            values = labels[mask]
            labels[mask] = values[torch.randperm(len(values), generator=gen)]
            return {**data, "labels": labels}
        x, y = data
        return x, y[torch.randperm(len(y), generator=gen)]


class ScaleParams(BehaviourParams):
    factor: float = Field(10.0, description="the delta is multiplied by this")


class ScaleUpdate(ClientBehaviour):
    params: ScaleParams

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        return delta * np.float32(self.params.factor)


BEHAVIOURS.register(Hook("corrupt", Corrupt, CorruptParams, "fault injection"))
BEHAVIOURS.register(
    Hook("label_shuffle", LabelShuffle, BehaviourParams, "fedbaf.md §4.4 (untargeted attacker)")
)
BEHAVIOURS.register(Hook("scale_update", ScaleUpdate, ScaleParams, "update boosting"))
