"""General-purpose client behaviours (``hooks.clients``): faults and attacks any method may meet.

- ``corrupt``: poison the update with NaN or Inf (what ``faults.corrupt_updates`` configures; the
  coordinator rejects such updates).
- ``scale_update``: the client multiplies its delta by a factor (update boosting).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from ..base import ClientContext
from ..hooks import BehaviourParams, ClientBehaviour
from ..registry import BEHAVIOURS, Hook


class CorruptParams(BehaviourParams):
    value: Literal["nan", "inf"] = "nan"


class Corrupt(ClientBehaviour):
    params: CorruptParams

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        delta = np.array(delta, copy=True)
        delta[0] = np.float32(self.params.value)
        return delta


class ScaleParams(BehaviourParams):
    factor: float = Field(10.0, description="the delta is multiplied by this")


class ScaleUpdate(ClientBehaviour):
    params: ScaleParams

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        return delta * np.float32(self.params.factor)


BEHAVIOURS.register(Hook("corrupt", Corrupt, CorruptParams, "fault injection"))
BEHAVIOURS.register(Hook("scale_update", ScaleUpdate, ScaleParams, "update boosting"))
