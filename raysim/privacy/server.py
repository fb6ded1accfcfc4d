"""The server's side of differential privacy: a strategy wrapped so that every sum it takes is
released through the Gaussian mechanism, and the privacy spent is accounted after each one.

``PrivateStrategy`` wraps a method whose strategy sums its clients' deltas (``sums_updates``:
it reads them only through ``WeightedMean.combine``). Inside its hooks a ``GaussianSum`` is in
force (``raysim.algorithms.exact_sum.mechanism``), so each of the method's sums becomes

    Σ_k a'_k·clip(Δ_k) + N(0, (z_Δ·C·max_k a'_k)²·I),   a'_k = a_k·m / D

with a_k the weights the method gave (clients count equally: each update's ``num_samples`` is 1,
DP-FedAvg's w_k = 1), m the updates in the sum and D the updates one aggregation expects
(``Strategy.updates_per_aggregation``): the fixed denominator of McMahan et al. 2018 §2, so
FedAvg's step is ``(Σ clip(Δ_k) + N(0, z²C²))/D``. Every sum is one mechanism for the
accountant (``raysim.privacy.accounting``). numpy only; no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.algorithms.base import Downlink, Strategy, Update
from raysim.algorithms.context import ServerContext
from raysim.algorithms.exact_sum import mechanism
from raysim.algorithms.hooks import ComposedStrategy
from raysim.errors import PrivacyError

from .clipping import CLIP_KEY, SHARE_KEY, WITHIN_METRIC
from .sampling import AccountedSampling
from .settings import PrivacyConfig

if TYPE_CHECKING:
    from .sample_level import SampleLevelLedger

#: the noise of aggregation i: default_rng([the server stream "privacy/noise", i])
NOISE_STREAM = "privacy/noise"
#: adaptive clipping's noise on the count of clients within C, per round
COUNT_STREAM = "privacy/count"


class BudgetSpent(Exception):
    """A sum that would take ε past ``privacy.epsilon_budget``: not taken; the run ends."""


class GaussianSum:
    """The mechanism every sum of a ``PrivateStrategy`` goes through (``SumMechanism``)."""

    def __init__(self, owner: PrivateStrategy) -> None:
        self.owner = owner

    def weights(self, weights: Sequence[float]) -> list[float]:
        scale = len(weights) / self.owner.denominator
        return [float(w) * scale for w in weights]

    def release(self, total: np.ndarray, weights: Sequence[float]) -> np.ndarray:
        o = self.owner
        o.spend()
        top = max((abs(w) for w in weights), default=0.0)
        rng = np.random.default_rng([o.ctx.stream_seed(NOISE_STREAM), o.aggregations - 1])
        if o.distributed:
            return self._distributed(total, weights, top, rng)
        std = o.delta_multiplier * o.clip * top
        if std == 0.0:
            return total
        noise = rng.standard_normal(total.shape, dtype=np.float32)
        return (total + noise * np.float32(std)).astype(np.float32, copy=False)

    def _distributed(
        self, total: np.ndarray, weights: Sequence[float], top: float, rng: np.random.Generator
    ) -> np.ndarray:
        """Distributed DP: the clients' noise is in ``total`` already; secure aggregation gives
        the server their plain sum, so each must weigh the same. A round that gave the method
        no update (``PrivateStrategy._nobody``) has no share in it: the noise its sum would
        carry, N_Z of variance (z·C·2^f)² units, is drawn here."""
        o = self.owner
        if any(abs(w - top) > 1e-12 * top for w in weights):
            raise PrivacyError(
                "privacy.secure_aggregation.noise: secure aggregation gives the server the plain "
                "sum of the clients' noised deltas, but this method weighs them unequally; use "
                "secure_aggregation.noise server"
            )
        if not o.empty_release:
            return total
        from . import secagg
        from .secure_rounds import secagg_config

        s = o.privacy.secure_aggregation
        grid = secagg_config(s, o.clip)
        units = secagg.integer_noise(s.noise, total.shape, o.noise_multiplier * o.clip, grid, rng)
        noise = np.ldexp(units.astype(np.float64), -s.scale_bits) * top
        return (total + noise).astype(np.float32)


class PrivateStrategy(ComposedStrategy):
    """A strategy (plain or composed) under ``privacy`` (``central`` or ``local``).

    ``schedule`` is what the accountant assumes of the sampling (``sampling.sampling_of``);
    ``planned`` the aggregations a ``target_epsilon`` is calibrated for.
    """

    def __init__(
        self,
        inner: Strategy,
        cfg: PrivacyConfig,
        schedule: AccountedSampling,
        delta: float,
        planned: int,
        rounds: int = 0,
        sample_level: SampleLevelLedger | None = None,
    ) -> None:
        """``rounds``: the run's planned rounds (its audit, if any, runs after the last);
        ``sample_level``: the account of the clients' DP-SGD (``local.dp_sgd``), if they use it."""
        super().__init__(inner, [])
        self.sample_level = sample_level
        self.rounds = rounds
        self.audit_metrics: dict[str, float] = {}
        self.privacy = cfg
        self.schedule = schedule
        self.delta = delta
        self.planned = planned
        self.clip = cfg.clip
        self.aggregations = 0
        self.participations: dict[int, int] = {}
        #: the adaptive count's bits since the last round with a sum, and that round's sums
        self._within: list[float] = []
        self._adapted_at = 0
        #: updates given to the method this round (none: an empty Poisson round, see below)
        self._taken = 0
        self._stop: str | None = None
        #: distributed DP: the clients add the noise (``secure_aggregation.noise``)
        self.distributed = cfg.secure_aggregation.noise != "server"
        #: a round that gave the method no update is being released (noise alone)
        self.empty_release = False
        self.sum = GaussianSum(self)

    # ----------------------------------------------------------------- set up
    def setup(self, ctx: ServerContext) -> None:
        from . import accounting

        super().setup(ctx)
        self.ctx = ctx
        cfg = self.privacy
        self.denominator = self.base.updates_per_aggregation(self.schedule.per_round_expected)
        self.noise_multiplier = cfg.noise_multiplier
        if self.distributed and cfg.target_epsilon is not None:
            from . import distributed

            self.noise_multiplier = distributed.calibrate(
                cfg.target_epsilon,
                self.delta,
                self.planned,
                self.schedule.accounted,
                self._integer_noise(),
                cfg.max_noise_multiplier,
            )
        elif cfg.mode == "central" and cfg.target_epsilon is not None:
            self.noise_multiplier = accounting.calibrate(
                cfg.target_epsilon,
                self.delta,
                self.planned,
                self.schedule.accounted,
                cfg.accountant,
                cfg.max_noise_multiplier,
            )
        self.count_stddev = 0.0
        self.delta_multiplier = self.noise_multiplier
        if cfg.mode == "central" and cfg.adaptive.enabled:
            self.count_stddev = cfg.adaptive.count_stddev or self.denominator / 20
            self.delta_multiplier = accounting.delta_noise_multiplier(
                self.noise_multiplier, self.count_stddev
            )
        if cfg.mode == "central":
            self._new_accountant()
        self.canaries = None
        if cfg.audit.canaries:
            from .canaries import Canaries

            self.canaries = Canaries(cfg, ctx.seed, ctx.num_clients)
            self.initial = self.base.weights.copy()  # setup precedes a resume's state
        self.secure = None
        if cfg.secure_aggregation.enabled:
            from .secure_rounds import SecureRounds, checked

            s = self.schedule.per_round_expected
            bound = 8 * self._share(s) if self.distributed else 0.0  # 8 std: P ≈ 1e-15 a value
            checked(cfg.secure_aggregation, self.clip, s, bound)
            self.secure = SecureRounds(cfg.secure_aggregation, ctx, self.base.weights.size)

    def _share(self, clients: int) -> float:
        """Distributed DP: each client's noise std (real units) in a round of ``clients``, so
        that the fewest survivors secure aggregation unmasks, ⌈threshold·n⌉, carry z·C."""
        from .secagg import required_survivors
        from .secure_rounds import secagg_config

        grid = secagg_config(self.privacy.secure_aggregation, self.clip)
        need = required_survivors(grid, max(1, clients))
        return self.noise_multiplier * self.clip / math.sqrt(need)

    def _integer_noise(self) -> Any:
        """Distributed DP's noise as its accountant sees it (``distributed.IntegerNoise``)."""
        from .distributed import IntegerNoise

        s = self.privacy.secure_aggregation
        sched = self.schedule.accounted
        most = sched.per_round if sched.sampling == "without_replacement" else sched.population
        return IntegerNoise(
            kind=s.noise,
            dim=int(self.base.weights.size),
            clip_units=math.ldexp(self.clip, s.scale_bits),
            noise_multiplier=self.noise_multiplier,
            max_shares=int(most),
        )

    def _new_accountant(self) -> None:
        """The accountant, with the aggregations taken so far (a resumed run's too)."""
        from . import accounting

        if self.distributed:
            from .distributed import DistributedAccountant

            self.accountant = DistributedAccountant(
                self._integer_noise(), self.schedule.accounted, self.delta
            )
        else:
            self.accountant = accounting.Accountant(
                self.schedule.accounted, self.noise_multiplier, self.delta, self.privacy.accountant
            )
        if self.aggregations:
            self.accountant.step(self.aggregations)

    @property
    def stop_reason(self) -> str | None:
        return self._stop or self.base.stop_reason

    def notices(self) -> list[str]:
        return [*self.base.notices(), *self.schedule.notices]

    # ----------------------------------------------------------------- the round
    def configure(self, round_index: int, clients: Sequence[int]) -> Downlink | None:
        if self.secure is not None:
            self.secure.start(round_index, clients)
        down = self.base.configure(round_index, clients)
        extra = {}
        if self.privacy.adaptive.enabled:
            extra[CLIP_KEY] = np.array([self.clip], dtype=np.float64)
        if self.distributed:
            extra[SHARE_KEY] = np.array([self._share(len(clients))], dtype=np.float64)
        if not extra:
            return down
        if down is None:
            return Downlink(tensors=extra)
        return Downlink(tensors={**down.tensors, **extra}, per_client=down.per_client)

    def on_arrival(self, update: Update) -> bool:
        if self._stop is not None:
            return False  # the budget is spent: nothing more is summed
        if self.sample_level is not None:
            self.sample_level.record(update.client_id, update.num_samples, update.metrics)
        if update.extras:
            raise PrivacyError(
                f"privacy covers a client's delta only; this method's clients also send "
                f"{', '.join(sorted(update.extras))} (ClientContext.upload), which no noise "
                "covers: set privacy.mode none for it"
            )
        if self.secure is not None:  # summed, if at all, when the round's protocol ends
            self.secure.admit(update)
            return False
        return self._take(update)

    def _take(self, update: Update) -> bool:
        """An update the server sums: to the method, each client weighing the same (central)."""
        if self.privacy.adaptive.enabled:
            self._within.append(float(update.metrics.get(WITHIN_METRIC, 1.0)))
        if self.privacy.mode == "local":  # each client's own ε counts its releases
            c = update.client_id
            self.participations[c] = self.participations.get(c, 0) + 1
        if self.privacy.mode == "central":
            update = replace(update, num_samples=1)  # DP-FedAvg's w_k = 1
        self._taken += 1
        return self._guarded(super().on_arrival, update)

    def on_round_end(self, round_index: int) -> bool:
        changed = False
        if self.secure is not None and self._stop is None:
            for u in self.secure.finish(self.clip):
                changed = self._take(u) or changed
        empty = self._stop is None and self._releases_empty_round()
        self._taken = 0
        if self._stop is None:
            self.empty_release = empty
            try:
                if empty:
                    changed = self._guarded(super().on_arrival, self._nobody(round_index))
                changed = self._guarded(super().on_round_end, round_index) or changed
            finally:
                self.empty_release = False
        if self.aggregations > self._adapted_at:  # one count released per round with a sum
            if self.privacy.adaptive.enabled:
                self._adapt(round_index)
            self._within = []
            self._adapted_at = self.aggregations
        budget = self.privacy.epsilon_budget
        if self._stop is None and budget is not None and self.privacy.mode == "central":
            after = self.accountant.epsilon_after(self.accountant.steps + 1)
            if after > budget:
                self._stop = (
                    f"privacy budget spent: ε = {self.accountant.epsilon():.4g} after "
                    f"{self.aggregations} aggregations; one more would reach {after:.4g} > "
                    f"privacy.epsilon_budget {budget:g}"
                )
        last = round_index + 1 >= self.rounds or self._stop is not None
        if self.canaries is not None and last and not self.audit_metrics:
            found = self.canaries.audit(self.weights - self.initial, self.delta)
            self.audit_metrics = found.as_metrics()
        return changed

    def _releases_empty_round(self) -> bool:
        """Whether this round gave the method no update (it sampled no client, or they all
        failed or dropped out of secure aggregation) and must still release noise alone: central
        DP with Poisson sampling amplified (no delays) and a method that sums once a round. The
        Poisson analysis counts every round as one mechanism whatever it sampled; a round that
        released nothing would tell whoever watches the model that nobody was sampled."""
        return (
            self._taken == 0
            and self.privacy.mode == "central"
            and self.schedule.accounted.sampling == "poisson"
            and not self.schedule.notices
            and self.base.uses_clients
            and self.base.sums_each_round
        )

    def _nobody(self, round_index: int) -> Update:
        """The update that stands for no client: a zero delta of weight 1, so the method's sum
        is ``0 + N(0, (z·C·a')²)``, the noise alone, and its server step runs on it."""
        w = self.base.weights
        return Update(
            client_id=-1,
            delta=np.zeros(w.size, dtype=np.float32),
            num_samples=1,
            dispatch_round=round_index,
            dispatch_version=0,
            arrival_time=float(round_index),
            arrival_round=round_index,
            tau_versions=0,
            base=w,
        )

    def _guarded(self, hook: Any, arg: Any) -> bool:
        with mechanism(self.sum if self.privacy.mode == "central" else None):
            try:
                return hook(arg)
            except BudgetSpent as spent:
                self._stop = str(spent)
                return False

    def spend(self) -> None:
        """One more sum: refused (``BudgetSpent``) where it would take ε past the budget."""
        budget = self.privacy.epsilon_budget
        if budget is not None:
            after = self.accountant.epsilon_after(self.accountant.steps + 1)
            if after > budget:
                raise BudgetSpent(
                    f"privacy budget spent: one more aggregation would reach ε = {after:.4g} > "
                    f"privacy.epsilon_budget {budget:g}"
                )
        self.accountant.step()
        self.aggregations += 1

    def _adapt(self, round_index: int) -> None:
        """Andrew et al. 2021 Alg. 1 with centred bits (their §3, as TFF implements it):
        b̄ = (Σ (b_k − ½) + N(0, σ_b²))/D + ½, then C ← C·exp(−η_C(b̄ − γ)). Centring makes the
        count's sensitivity ½ (add/remove), which is what z_Δ's 2σ_b assumes."""
        a = self.privacy.adaptive
        rng = np.random.default_rng([self.ctx.stream_seed(COUNT_STREAM), round_index])
        centred = sum(b - 0.5 for b in self._within) + rng.normal(0.0, self.count_stddev)
        noised = centred / self.denominator + 0.5
        self.clip = float(self.clip * math.exp(-a.learning_rate * (noised - a.target_quantile)))

    # ----------------------------------------------------------------- reports
    def epsilon(self) -> float:
        """ε(δ) spent so far: the run's (central), or that of the client that took part most
        often (local: each release is its own Gaussian mechanism)."""
        from . import accounting

        if self.privacy.mode == "central":
            return self.accountant.epsilon()
        most = max(self.participations.values(), default=0)
        return accounting.local_epsilon(self.noise_multiplier, most, self.delta)

    def metrics(self) -> dict[str, float]:
        out = dict(self.base.metrics())
        if self.sample_level is not None:
            out.update(self.sample_level.metrics())
        if not self.privacy.enabled:
            return out
        out.update(
            dp_epsilon=self.epsilon(),
            dp_delta=self.delta,
            dp_noise_multiplier=self.noise_multiplier,
            dp_clip=self.clip,
            dp_aggregations=float(self.aggregations),
        )
        out.update(self.audit_metrics)
        if self.secure is not None:
            out.update(self.secure.metrics())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "privacy": {
                "clip": self.clip,
                "aggregations": self.aggregations,
                "participations": dict(self.participations),
                "stop": self._stop,
                "within": list(self._within),
                "adapted_at": self._adapted_at,
                "audit": dict(self.audit_metrics),
                "secure": self.secure.state_dict() if self.secure is not None else {},
                "sample_level": (
                    self.sample_level.state_dict() if self.sample_level is not None else {}
                ),
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        p = state["privacy"]
        self.clip = float(p["clip"])
        self.aggregations = int(p["aggregations"])
        self.participations = {int(k): int(v) for k, v in p["participations"].items()}
        self._stop = p["stop"]
        self._within = [float(b) for b in p.get("within", [])]
        self._adapted_at = int(p.get("adapted_at", self.aggregations))
        self.audit_metrics = dict(p.get("audit", {}))
        if self.secure is not None:
            self.secure.load_state_dict(p.get("secure", {}))
        if self.sample_level is not None:
            self.sample_level.load_state_dict(p.get("sample_level", {}))
        if self.privacy.mode == "central":
            self._new_accountant()
