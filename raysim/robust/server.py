"""A strategy whose round of client deltas goes through a robust rule and its forging attackers.

``RobustStrategy`` wraps a method whose synchronous server step averages the round's client
deltas (``MethodSpec.sums``, not asynchronous). It holds the round's updates until the round
ends, then, in client-id order (so nothing depends on arrival order or on the workers):

1. the clients of a forging behaviour (``ClientBehaviour.forge``: IPM, ALIE, min-max, min-sum,
   a mean sign flip) send the update it forges from the round's benign updates, which the
   attacker is assumed to see (the omniscient attacker of those papers);
2. the rule (``robust.rule``, ``raysim.robust.rules``) turns the n updates into one delta, which
   the method receives as the round's only update (weight 1), so its server step, plain or with
   a server optimiser, runs on the robust aggregate; with ``rule: none`` (or ``norm_bound``,
   applied on the workers) the method receives every update as it would have.

A round with fewer updates than the rule's assumption needs (clients failed or dropped) leaves
the model as it is and says so in ``robust_skipped``. numpy only; no Ray.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.algorithms.base import Strategy, Update
from raysim.algorithms.hooks import ClientBehaviour, ComposedStrategy

from . import rules
from .settings import RobustConfig

if TYPE_CHECKING:
    from raysim.config import RunConfig


def aggregate(
    settings: RobustConfig, x: np.ndarray, weights: np.ndarray, centre: np.ndarray | None
) -> tuple[np.ndarray, list[int] | None]:
    """The rule's delta for the round's updates ``x`` (n, d), and the rows it picked (Krum,
    Multi-Krum, Bulyan; None for the others)."""
    rule, f = settings.rule, settings.f
    k = settings.krum
    if rule in ("krum", "multi_krum"):
        m = 1 if rule == "krum" else (k.m if k.m is not None else len(x) - f)
        chosen = rules.krum_chosen(x, f, min(m, len(x)), k.neighbours)
        return rules.mean_of(x, chosen), chosen
    if rule == "bulyan":
        return rules.bulyan(x, f, k.neighbours), rules.bulyan_chosen(x, f, k.neighbours)
    if rule == "median":
        return rules.median(x), None
    if rule == "trimmed_mean":
        return rules.trimmed_mean(x, f), None
    if rule == "geometric_median":
        g = settings.geometric_median
        w = weights if g.weighted else None
        return rules.geometric_median(x, w, g.nu, g.iterations, g.tolerance, g.init), None
    if rule == "centered_clipping":
        c = settings.centered_clipping
        start = centre if centre is not None and c.centre == "previous" else np.zeros(x.shape[1])
        return rules.centered_clipping(x, start, c.tau, c.iterations), None
    raise ValueError(f"robust.rule {rule} does not aggregate on the server")


class RobustStrategy(ComposedStrategy):
    """A synchronous averaging strategy under ``robust`` and forging attackers (module doc)."""

    def __init__(
        self, inner: Strategy, settings: RobustConfig, behaviours: list[ClientBehaviour]
    ) -> None:
        super().__init__(inner, [])
        self.settings = settings
        self.forgers = [b for b in behaviours if b.forges]
        self.attackers = [b for b in behaviours if b.attack or b.forges]
        self.held: list[Update] = []
        #: centred clipping's centre: the last aggregate (Karimireddy et al.'s momentum)
        self.centre: np.ndarray | None = None
        self.round_metrics: dict[str, float] = {}

    @property
    def holds(self) -> bool:
        return self.settings.reads_each_update or bool(self.forgers)

    @property
    def sums_updates(self) -> bool:
        """False: the rule and the forgers read each update whole."""
        return False if self.holds else self.base.sums_updates

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "held": self.held, "centre": self.centre}

    def load_state_dict(self, state: Any) -> None:
        super().load_state_dict(state)
        self.held, self.centre = list(state["held"]), state["centre"]

    def on_arrival(self, update: Update) -> bool:
        if not self.holds:
            return super().on_arrival(update)
        self.held.append(update)
        return False

    def on_round_end(self, round_index: int) -> bool:
        held = sorted(self.held, key=lambda u: (u.client_id, u.dispatch_round))
        self.held = []
        self.round_metrics = {}
        changed = False
        if held:
            held = self._forged(held)
            feed = held
            if self.settings.reads_each_update:
                combined = self._combined(held)
                feed = [] if combined is None else [combined]
            for u in feed:
                changed = super().on_arrival(u) or changed
        return super().on_round_end(round_index) or changed

    def _attacking(self, u: Update, among: list[ClientBehaviour]) -> ClientBehaviour | None:
        return next((b for b in among if b.applies(u.client_id, u.dispatch_round)), None)

    def _forged(self, held: list[Update]) -> list[Update]:
        """The round's updates with each forging attacker's replaced by its forgery."""
        by = [self._attacking(u, self.forgers) for u in held]
        honest = [u for u, b in zip(held, by, strict=True) if b is None]
        forged = len(held) - len(honest)
        self.round_metrics["robust_attackers"] = float(
            sum(self._attacking(u, self.attackers) is not None for u in held)
        )
        self.round_metrics["robust_forged"] = float(forged)
        if not forged or not honest:  # nothing to forge from: the attackers' own updates stay
            return held
        x = np.stack([np.asarray(u.delta, dtype=np.float32) for u in honest])
        made: dict[int, np.ndarray] = {}
        out = []
        for u, b in zip(held, by, strict=True):
            if b is not None:
                if id(b) not in made:
                    v = np.asarray(b.forge(x, len(held), forged), dtype=np.float32)
                    if v.shape != x.shape[1:] or not np.isfinite(v).all():
                        raise ValueError(
                            f"{type(b).__name__}.forge returned {v.shape} values, not "
                            f"{x.shape[1]} finite ones"
                        )
                    if self.settings.rule == "norm_bound":  # as the workers clip the others
                        v = rules.norm_bound(v, self.settings.norm_bound.max_norm)
                    made[id(b)] = v
                u = replace(u, delta=made[id(b)])
            out.append(u)
        return out

    def _combined(self, held: list[Update]) -> Update | None:
        """The rule's aggregate as one update of weight 1 (None: too few updates this round)."""
        n, s = len(held), self.settings
        rule = rules.RULES[s.rule]
        if not rule.valid(n, s.f):
            self.round_metrics["robust_skipped"] = 1.0
            return None
        if any(u.extras for u in held):
            raise ValueError(
                f"robust.rule {s.rule} reads the clients' deltas only; this method's clients "
                "also send named arrays (ClientContext.upload): set robust.rule none for it"
            )
        x = np.stack([np.asarray(u.delta, dtype=np.float32) for u in held])
        weights = np.array([u.num_samples for u in held], dtype=np.float64)
        delta, chosen = aggregate(s, x, weights, self.centre)
        if s.rule == "centered_clipping":
            self.centre = delta.astype(np.float64)
        if chosen is not None:
            picked = [held[i] for i in chosen]
            self.round_metrics["robust_attackers_chosen"] = float(
                sum(self._attacking(u, self.attackers) is not None for u in picked)
            )
        return replace(held[0], client_id=-1, delta=delta, num_samples=1)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), **self.round_metrics}


def robust(strategy: Strategy, cfg: RunConfig) -> Strategy:
    """``strategy`` wrapped by ``RobustStrategy`` where the run has a server-side rule or a
    forging attacker; else itself (and no behaviour is built on the server)."""
    if not cfg.reads_each_update():
        return strategy
    from raysim.algorithms.registry import BEHAVIOURS

    behaviours = [BEHAVIOURS.get(name).build(p) for name, p in cfg.client_hooks()]
    for b in behaviours:  # the same adversaries as the workers': from the run seed
        b.setup(cfg.seed, cfg.clients.num)
    return RobustStrategy(strategy, cfg.robust, behaviours)
