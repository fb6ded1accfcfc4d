"""A user's hooks module, named by ``module:`` on ``hooks.server`` / ``hooks.clients`` entries; no
method module is involved. ``halve_step`` keeps half of every server step; ``zero_update`` makes
the chosen clients send a zero delta."""

import numpy as np
from pydantic import Field

from raysim.algorithms import BEHAVIOURS, MIXERS, ClientBehaviour, Hook, HookParams, Mixer
from raysim.algorithms.hooks import BehaviourParams


class HalveParams(HookParams):
    keep: float = Field(0.5, gt=0, le=1)


class HalveStep(Mixer):
    params: HalveParams

    def mix(self, round_index: int, previous: np.ndarray, aggregated: np.ndarray) -> np.ndarray:
        return previous + np.float32(self.params.keep) * (aggregated - previous)


class ZeroUpdate(ClientBehaviour):
    def on_update(self, ctx, delta: np.ndarray) -> np.ndarray:
        return np.zeros_like(delta)


MIXERS.register(Hook("halve_step", HalveStep, HalveParams, "tests: a user's mixer"))
BEHAVIOURS.register(Hook("zero_update", ZeroUpdate, BehaviourParams, "tests: a user's behaviour"))
