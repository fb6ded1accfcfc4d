"""A one-run privacy audit run beside a private run: which clients are canaries, what each
sends, and the audit at the run's end (the statistics are in ``raysim.privacy.audit``).

Canary i is client ``canary_clients(...)[i]``, a seeded draw from the population. A canary that
takes part (``CanaryPlan.included``) sends its direction scaled to the round's clip norm C, in
place of its trained delta, whenever it is sampled; one that does not sends a zero update (a
replace-one neighbour of the run). numpy only.
"""

from __future__ import annotations

import numpy as np

from .audit import AuditResult, CanaryPlan, audit
from .settings import PrivacyConfig

#: canary clients: default_rng([seed, CANARY_CLIENTS_TAG]).permutation(N)[:m]
CANARY_CLIENTS_TAG = 0xCA1E
#: the audit's own seed: SeedSequence([run seed, CANARY_PLAN_TAG])
CANARY_PLAN_TAG = 0xCA9A


def canary_clients(canaries: int, seed: int, num_clients: int) -> np.ndarray:
    """The client id of each canary, in canary order."""
    order = np.random.default_rng([seed, CANARY_CLIENTS_TAG]).permutation(num_clients)
    return order[:canaries].astype(np.int64)


def canary_plan(canaries: int, seed: int) -> CanaryPlan:
    """The run's canaries: who takes part and each one's direction, from the run seed."""
    plan_seed = int(np.random.SeedSequence([seed, CANARY_PLAN_TAG]).generate_state(1)[0])
    return CanaryPlan(canaries, plan_seed)


class Canaries:
    """The canaries of a run, as a worker and the server both see them."""

    def __init__(self, cfg: PrivacyConfig, seed: int, num_clients: int) -> None:
        self.cfg = cfg.audit
        m = self.cfg.canaries
        self.plan = canary_plan(m, seed)
        self.index = {int(c): i for i, c in enumerate(canary_clients(m, seed, num_clients))}
        self.included = self.plan.included()

    def update(self, client: int, delta: np.ndarray, bound: float) -> np.ndarray:
        """What ``client`` sends: its own delta, or (a canary) its direction times C or 0."""
        i = self.index.get(client)
        if i is None:
            return delta
        if not self.included[i]:
            return np.zeros_like(delta)
        return self.plan.direction(i, delta.size).reshape(delta.shape) * np.float32(bound)

    def audit(self, model_delta: np.ndarray, delta: float) -> AuditResult:
        """The audit of a run whose global model moved by ``model_delta`` over all its rounds."""
        k_plus, k_minus = self.cfg.split()
        return audit(model_delta, self.plan, k_plus, k_minus, delta, self.cfg.confidence)
