"""The extraction harness of FedBaF spec §6.2–6.3 against a finished run's observer records.

Attacks, each scored on the matched coordinates against the true foundation (which only the
researcher running the harness holds):

- ``broadcast``: the broadcast ``w_t`` itself (the paper's Dist per round, Fig. 7);
- ``E2``: two consecutive rounds, random α (``extraction.e2_two_rounds``); exact when every
  participant of both rounds colluded, approximate otherwise (``complete`` says which);
- ``E0``: the same with a static α (``alpha_random: false`` runs only);
- ``E1``: one curious client of round 0, with ĉ ∈ {ψ, 1.5ψ, 2ψ} and a line search over c against
  its own training loss (§6.2).

Functional similarity: linear CKA between the features (the input of the model's last Linear
layer) of the estimate and of the foundation's body, on probe inputs from the test split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from raysim.algorithms.fedbaf.mixer import INTEGER_BUFFERS, MatchedFoundation
from raysim.security.extraction import Closeness, e0_static_alpha, e1_one_round, e2_two_rounds
from raysim.security.observations import ObservedRound

#: the guesses of c_0 that E1 tries, as multiples of ψ (§6.2: the middle of [ψ, 2ψ] and its ends)
E1_GUESSES = (1.0, 1.5, 2.0)
#: the line search's grid of c / ψ
E1_GRID = tuple(np.round(np.linspace(0.25, 4.0, 16), 4))


@dataclass
class Attempt:
    """One estimate of the foundation and how close it came."""

    attack: str
    round: int
    detail: str
    complete: bool  # every participant of the rounds used colluded
    relative_error: float
    cosine: float
    dist: float
    cka: float = float("nan")

    def row(self) -> dict[str, Any]:
        return asdict(self)


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019) between two feature matrices over the same inputs."""
    x = np.asarray(x, np.float64) - np.mean(x, axis=0)
    y = np.asarray(y, np.float64) - np.mean(y, axis=0)
    num = np.linalg.norm(y.T @ x) ** 2
    den = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(num / den) if den > 0 else float("nan")


class FeatureProbe:
    """Features of a weight vector: the input of the model's last Linear layer on fixed inputs."""

    def __init__(self, handle: Any, inputs: np.ndarray) -> None:
        self.handle = handle
        self.inputs = torch.as_tensor(inputs)
        linears = [m for m in handle.module.modules() if isinstance(m, torch.nn.Linear)]
        if not linears:
            raise ValueError("the model has no Linear layer whose input could serve as features")
        self.head = linears[-1]

    @torch.no_grad()
    def features(self, weights: np.ndarray) -> np.ndarray:
        self.handle.set_global(np.asarray(weights, dtype=np.float32))
        captured: list[torch.Tensor] = []
        hook = self.head.register_forward_pre_hook(lambda _m, a: captured.append(a[0].detach()))
        try:
            self.handle.module.eval()
            self.handle.module(self.inputs)
        finally:
            hook.remove()
        return captured[0].reshape(len(self.inputs), -1).double().cpu().numpy()


class Harness:
    """Runs the attacks on observed rounds and scores them against the foundation."""

    def __init__(
        self,
        truth: MatchedFoundation,
        rounds: dict[int, ObservedRound],
        aggregates: dict[int, np.ndarray],
        *,
        psi: float,
        per_round: int,
        probe: FeatureProbe | None = None,
        local_loss: Callable[[int, np.ndarray], float] | None = None,
        tau_scope: np.ndarray | None = None,
    ) -> None:
        self.truth = truth
        self.rounds = rounds
        self.aggregates = aggregates
        self.psi = psi
        self.per_round = per_round
        self.probe = probe
        self.local_loss = local_loss
        self.scope = tau_scope
        self._pre_features: np.ndarray | None = None

    # ------------------------------------------------------------------ scoring
    def _foundation_vector(self, like: np.ndarray) -> np.ndarray:
        out = np.array(like, dtype=np.float64, copy=True)
        out[self.truth.indices] = self.truth.values
        return out

    def score(
        self, attack: str, t: int, detail: str, estimate: np.ndarray, complete: bool
    ) -> Attempt:
        m = self.truth.indices
        c = Closeness.of(estimate[m], self.truth.values)
        cka = float("nan")
        if self.probe is not None:
            if self._pre_features is None:
                self._pre_features = self.probe.features(self._foundation_vector(estimate))
            cka = linear_cka(self.probe.features(estimate), self._pre_features)
        return Attempt(attack, t, detail, complete, c.relative_error, c.cosine, c.dist, cka)

    def complete(self, *ts: int) -> bool:
        return all(len(self.rounds[t].updates) >= self.per_round for t in ts)

    # ------------------------------------------------------------------ attacks
    def broadcasts(self) -> list[Attempt]:
        """Each observed broadcast w_t as it is (Dist per round, Fig. 7)."""
        return [self.score("broadcast", t, "w_t", r.received, True) for t, r in self.rounds.items()]

    def _triples(self) -> list[int]:
        return [t for t in self.rounds if t + 1 in self.rounds and t + 2 in self.rounds]

    def e2(self) -> list[Attempt]:
        out = []
        for t in self._triples():
            w1, w2 = self.rounds[t + 1].received, self.rounds[t + 2].received
            est = e2_two_rounds(w1, self.aggregates[t], w2, self.aggregates[t + 1])
            out.append(self.score("E2", t, "rounds t, t+1", est, self.complete(t, t + 1)))
        return out

    def e0(self) -> list[Attempt]:
        out = []
        s = self.scope if self.scope is not None else slice(None)
        for t in self._triples():
            w0, w1, w2 = (self.rounds[t + i].received for i in range(3))
            a1, a2 = self.aggregates[t], self.aggregates[t + 1]
            est_s = e0_static_alpha(w0[s], a1[s], w1[s], a2[s], w2[s], t)
            est = np.array(w1, dtype=np.float64, copy=True)
            est[s] = est_s  # outside the τ scope the estimate stays w_{t+1}
            out.append(self.score("E0", t, "static α", est, self.complete(t, t + 1)))
        return out

    def e1(self) -> list[Attempt]:
        """Every observer of round 0 alone: ŵ'_1 = w_0 + Δ_own, then c guessed or searched."""
        if 0 not in self.rounds or 1 not in self.rounds:
            return []
        w0, w1 = self.rounds[0].received, self.rounds[1].received
        out = []
        for client, delta, _n in self.rounds[0].updates:
            guess = w0.astype(np.float64) + delta
            for k in E1_GUESSES:
                est = e1_one_round(w1, guess, k * self.psi)
                out.append(self.score("E1", 0, f"client {client}, c={k:g}psi", est, False))
            if self.local_loss is not None and self.psi > 0:
                losses = [
                    self.local_loss(client, e1_one_round(w1, guess, g * self.psi)) for g in E1_GRID
                ]
                best = E1_GRID[int(np.nanargmin(losses))]
                est = e1_one_round(w1, guess, best * self.psi)
                detail = f"client {client}, line search c={best:g}psi"
                out.append(self.score("E1", 0, detail, est, False))
        return out

    def run(self, static_alpha: bool) -> list[Attempt]:
        attempts = self.broadcasts() + self.e1() + self.e2()
        return attempts + (self.e0() if static_alpha else [])


def tau_scope(layout: Any, tau_scope_name: str, matched: np.ndarray) -> np.ndarray:
    """The coordinates of FedBaF's norms, as the run's ``tau_scope`` chose (public)."""
    if tau_scope_name == "matched":
        return matched
    return np.flatnonzero(~layout.mask(pattern=INTEGER_BUFFERS))


def summarize(attempts: Sequence[Attempt]) -> dict[str, float]:
    """Headline numbers: the best (smallest) relative error and its cosine per attack, split by
    complete and partial collusion, and the broadcasts' smallest Dist."""
    out: dict[str, float] = {}
    groups: dict[str, list[Attempt]] = {}
    for a in attempts:
        key = (
            a.attack
            if a.attack in ("broadcast", "E1")
            else f"{a.attack}_{'full' if a.complete else 'partial'}"
        )
        groups.setdefault(key, []).append(a)
    for key, rows in groups.items():
        best = min(rows, key=lambda a: a.relative_error)
        out[f"{key}_relative_error_min"] = best.relative_error
        out[f"{key}_relative_error_median"] = float(np.median([a.relative_error for a in rows]))
        out[f"{key}_cosine_best"] = best.cosine
        if not math.isnan(best.cka):
            out[f"{key}_cka_best"] = best.cka
        out[f"{key}_count"] = float(len(rows))
    broadcasts = groups.get("broadcast", [])
    if broadcasts:
        out["broadcast_dist_min"] = min(a.dist for a in broadcasts)
    return out
