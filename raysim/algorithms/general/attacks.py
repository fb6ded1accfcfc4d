"""Model-poisoning attacks as client behaviours (``hooks.clients``), for robust aggregation.

Which clients attack, and in which rounds, follows from the run seed (``fraction``: a fixed set
of round(ζ·K) clients, ``chosen_clients``) or is listed (``clients``), as for every behaviour.

- On the workers, from the client's own update: ``sign_flip`` (−scale·Δ) and
  ``gaussian_update`` (N(μ, σ²), drawn from the run seed, the client and the round).
- Forged on the server from the round's benign updates (``forge``; ``raysim.robust.server``):
  ``sign_flip_mean``, ``ipm``, ``alie``, ``min_max``, ``min_sum``. These attackers see every
  benign update of the round before the server aggregates it, as the papers' omniscient
  attackers do; a real one would have to estimate them. The client still trains (its own update
  is discarded), so a run's cost does not depend on the attack.

``raysim.robust.attacks`` has the formulas and their papers; the backdoor by model replacement
is ``backdoor`` (raysim.algorithms.fedbaf.adversaries: a trigger, a target label, a boost).
"""

from __future__ import annotations

import numpy as np

from ...robust import attacks
from ..base import ClientContext
from ..hooks import ClientBehaviour
from ..registry import BEHAVIOURS, Hook
from .params import (
    HOOKS,
    ALIEParams,
    GaussianAttackParams,
    IPMParams,
    MinMaxParams,
    MinSumParams,
    SignFlipMeanParams,
    SignFlipParams,
)

#: a Gaussian attacker's draw: default_rng([seed, GAUSSIAN_TAG, client, dispatch round])
GAUSSIAN_TAG = 0x6A55


class SignFlip(ClientBehaviour):
    params: SignFlipParams
    attack = True

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        return (delta * np.float32(-self.params.scale)).astype(np.float32)


class GaussianUpdate(ClientBehaviour):
    params: GaussianAttackParams
    attack = True

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(
            [self.run_seed, GAUSSIAN_TAG, ctx.client_id, ctx.dispatch_round]
        )
        return attacks.gaussian(rng, delta.size, self.params.mu, self.params.sigma)


class SignFlipMean(ClientBehaviour):
    params: SignFlipMeanParams
    attack = True

    def forge(self, honest: np.ndarray, n: int, f: int) -> np.ndarray | None:
        return attacks.sign_flip_mean(honest, self.params.scale)


class IPM(ClientBehaviour):
    params: IPMParams
    attack = True

    def forge(self, honest: np.ndarray, n: int, f: int) -> np.ndarray | None:
        return attacks.ipm(honest, self.params.epsilon)


class ALIE(ClientBehaviour):
    params: ALIEParams
    attack = True

    def forge(self, honest: np.ndarray, n: int, f: int) -> np.ndarray | None:
        z = self.params.z if self.params.z is not None else attacks.alie_z(n, f)
        return attacks.alie(honest, z)


class MinMax(ClientBehaviour):
    params: MinMaxParams
    attack = True

    def forge(self, honest: np.ndarray, n: int, f: int) -> np.ndarray | None:
        return attacks.min_max(honest, self.params.perturbation, self.params.gamma_init)


class MinSum(ClientBehaviour):
    params: MinSumParams
    attack = True

    def forge(self, honest: np.ndarray, n: int, f: int) -> np.ndarray | None:
        p = self.params
        return attacks.min_sum(honest, p.perturbation, p.gamma_init, p.bound)


for _name, _cls in (
    ("sign_flip", SignFlip),
    ("gaussian_update", GaussianUpdate),
    ("sign_flip_mean", SignFlipMean),
    ("ipm", IPM),
    ("alie", ALIE),
    ("min_max", MinMax),
    ("min_sum", MinSum),
):
    BEHAVIOURS.register(Hook.of(HOOKS[_name], _cls))
