"""General-purpose client behaviours (``hooks.clients``): faults and attacks any method may meet.

- ``corrupt``: poison the update with NaN or Inf (what ``faults.corrupt_updates`` configures; the
  coordinator rejects such updates).
- ``scale_update``: the client multiplies its delta by a factor (update boosting).
"""

from __future__ import annotations

import numpy as np

from ..base import ClientContext
from ..hooks import ClientBehaviour
from ..registry import BEHAVIOURS, Hook
from .params import HOOKS, CorruptParams, ScaleParams


class Corrupt(ClientBehaviour):
    params: CorruptParams

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        delta = np.array(delta, copy=True)
        delta[0] = np.float32(self.params.value)
        return delta


class ScaleUpdate(ClientBehaviour):
    params: ScaleParams
    attack = True

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        return delta * np.float32(self.params.factor)


BEHAVIOURS.register(Hook.of(HOOKS["corrupt"], Corrupt))
BEHAVIOURS.register(Hook.of(HOOKS["scale_update"], ScaleUpdate))
