"""Verdicts on a paper's claims from a few seeds, with their statistics (issues 45, 62).

Every paper's ``report.py`` decides its claims here, by one set of rules (``RULES``, printed once
in each report):

- a cell is summarised by its mean and its sample standard deviation (``ddof = 1``) over seeds,
  and its best seed in the metric's own direction (named by every caller);
- a claim that one method beats another compares them **paired by seed** (same seed, same data
  split, same clients; ``Paired.by_seed`` pairs by the seed's name, never by position): the mean
  difference, its 95 % t-interval, and an exact one-sided sign-flip permutation p-value (all 2^n
  sign assignments of the n differences);
- a claim is **held** only where the whole 95 % interval lies on the claimed side of its margin
  **and** the exact one-sided p-value is at most 0.05; **not held** only where the interval lies
  wholly on the other side and the opposite one-sided p-value is at most 0.05; **inconclusive**
  otherwise. With 3 seeds the smallest one-sided p-value is 1/8, so 3 seeds never decide a
  comparison (the interval's own reading is printed beside it); 5 seeds decide when every seed's
  difference lies on one side (1/32);
- nothing is decided from no information: an interval of zero width (every seed the same
  difference: the seeds vary nothing the claim is about), a NaN in any seed, or a constant
  series in a correlation leave the claim inconclusive and say why;
- a closeness claim (|a − b| below a bound) is two one-sided tests (TOST): held where the 90 %
  t-interval lies inside the bound and both one-sided sign-flip p-values are at most 0.05;
- a correlation claim uses Spearman's ρ with an exact (or, past 8 points, a 20,000-draw, as
  (k + 1)/(N + 1)) two-sided permutation p-value: held or not held at p < 0.05 by the sign of ρ.
  A permutation test over one run's rounds treats the rounds as exchangeable, which a training
  curve's rounds are not: such a claim is read as descriptive in the report that makes it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
Verdict = Literal["held", "not held", "inconclusive"]
#: the level of every interval here, and the largest p-value that decides
LEVEL = 0.95
ALPHA = 1 - LEVEL
#: seeds above which sign flips are sampled, not enumerated
EXACT_SEEDS = 20

RULES = (
    "Verdicts: each cell is the mean ± sample standard deviation (ddof = 1) over seeds, with its "
    "best seed in the metric's direction. A comparison pairs two methods by seed and gives the "
    "mean difference with its 95 % t-interval and an exact one-sided sign-flip permutation "
    "p-value. A claim is **held** when the whole interval lies on the claimed side of its margin "
    "and p ≤ 0.05, **not held** when the interval lies wholly on the other side and the opposite "
    "one-sided p ≤ 0.05, and **inconclusive** otherwise: 3 seeds never decide (their smallest p "
    "is 1/8; what the interval alone says is printed beside), 5 seeds decide when every seed's "
    "difference lies on one side (p = 1/32). An interval of zero width (every seed the same "
    "difference), a NaN in a seed or a constant series decides nothing. A closeness claim "
    "(|a − b| below a bound) is two one-sided tests: held when the 90 % interval lies inside the "
    "bound and both one-sided p ≤ 0.05. A correlation claim uses Spearman's ρ with an exact (or, "
    "past 8 points, 20,000-draw, (k + 1)/(N + 1)) permutation p-value: held or not held at "
    "p < 0.05 by the sign of ρ. A claim of several parts is held when every part is, not held "
    "when any part is not."
)


@dataclass(frozen=True)
class Summary:
    """One cell over seeds: mean, sample standard deviation (ddof = 1; 0 for one seed), n, and
    the best seed in the metric's direction."""

    mean: float
    sd: float
    n: int
    best: float

    @classmethod
    def of(cls, values: Sequence[float], *, higher_is_better: bool) -> Summary:
        """``higher_is_better`` has no default: "best" is the largest value of an accuracy and
        the smallest of a loss, and every caller says which it holds."""
        a = np.asarray(values, dtype=np.float64)
        if not len(a):
            raise ValueError("no values to summarise")
        sd = float(a.std(ddof=1)) if len(a) > 1 else 0.0
        best = float(np.nanmax(a) if higher_is_better else np.nanmin(a))
        return cls(float(a.mean()), sd, len(a), best)

    def text(self, scale: float = 1.0, digits: int = 1) -> str:
        f = f"{{:.{digits}f}}"
        return (
            f"{f.format(scale * self.mean)} ± {f.format(scale * self.sd)} "
            f"(best {f.format(scale * self.best)}, n = {self.n})"
        )


def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df))


def sign_flip_p(differences: Sequence[float], greater: bool = True) -> float:
    """Exact one-sided p-value of the mean of ``differences`` being this large (``greater``) or
    this small under random signs: the share of the 2^n sign assignments whose mean is at least
    as extreme as the observed one (the observed assignment included)."""
    d = np.asarray(differences, dtype=np.float64)
    if len(d) > EXACT_SEEDS:
        raise ValueError(f"exact sign flips over more than {EXACT_SEEDS} seeds: use a sampled test")
    if np.isnan(d).any():
        return float("nan")
    observed = d.mean()
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    means = (signs * d).mean(axis=1)
    tol = 1e-12 * max(1.0, float(np.abs(d).max(initial=0.0)))
    extreme = means >= observed - tol if greater else means <= observed + tol
    return float(extreme.mean())


def decide(
    low: float, high: float, p_claimed: float, p_other: float, margin: float, greater: bool
) -> Verdict:
    """The rule of ``RULES``: the interval on one side of ``margin`` and that side's p ≤ 0.05."""
    above, below = low > margin, high < margin
    claimed, other = (above, below) if greater else (below, above)
    if claimed and p_claimed <= ALPHA:
        return HELD
    if other and p_other <= ALPHA:
        return NOT_HELD
    return INCONCLUSIVE


@dataclass(frozen=True)
class Paired:
    """``a − b`` paired by seed: mean difference, its 95 % interval, the one-sided p-value of
    the claimed direction, and the verdict on "a beats b by more than ``margin``" (``RULES``).

    ``interval_verdict`` is what the interval alone says (the rule before issue 62), printed
    beside an undecided verdict; ``why`` says why a claim could not be decided at all."""

    mean: float
    low: float
    high: float
    p: float
    n: int
    margin: float
    verdict: Verdict
    differences: tuple[float, ...] = ()
    greater: bool = True
    interval_verdict: Verdict = INCONCLUSIVE
    why: str = ""

    @classmethod
    def of(
        cls,
        a: Sequence[float],
        b: Sequence[float],
        margin: float = 0.0,
        greater: bool = True,
    ) -> Paired:
        """``greater``: the claim is a − b > margin; else a − b < margin. ``a[i]`` and ``b[i]``
        are the same seed's (``by_seed`` pairs named seeds)."""
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
            raise ValueError("a paired comparison needs two equal-length runs of 2+ seeds")
        d = x - y
        n, diffs = len(d), tuple(float(v) for v in d)
        if np.isnan(d).any():
            nan = float("nan")
            why = f"NaN in {int(np.isnan(d).sum())} of {n} seeds"
            return cls(nan, nan, nan, nan, n, margin, INCONCLUSIVE, diffs, greater, why=why)
        mean = float(d.mean())
        half = t_quantile(n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
        low, high = mean - half, mean + half
        p = sign_flip_p(d - margin, greater)
        p_other = sign_flip_p(d - margin, not greater)
        interval = decide(low, high, 0.0, 0.0, margin, greater)
        if half == 0.0:
            why = "no spread: every seed gave the same difference"
            return cls(mean, low, high, p, n, margin, INCONCLUSIVE, diffs, greater, interval, why)
        verdict = decide(low, high, p, p_other, margin, greater)
        return cls(mean, low, high, p, n, margin, verdict, diffs, greater, interval)

    @classmethod
    def by_seed(
        cls,
        a: Mapping[object, float],
        b: Mapping[object, float],
        margin: float = 0.0,
        greater: bool = True,
    ) -> Paired:
        """``of`` on the seeds both ``a`` and ``b`` ran, each keyed by its seed: pairs by name,
        so a missing or reordered seed cannot pair two different seeds."""
        seeds = sorted(set(a) & set(b), key=str)
        return cls.of([a[s] for s in seeds], [b[s] for s in seeds], margin, greater)

    def tost(self, bound: float) -> tuple[float, float, float]:
        """Two one-sided tests of "|a − b| < ``bound``": the 90 % t-interval and the larger of
        the two one-sided sign-flip p-values (a − b > −bound, a − b < bound)."""
        d = np.asarray(self.differences, dtype=np.float64)
        if self.why or not len(d):
            return float("nan"), float("nan"), float("nan")
        half = t_quantile(self.n - 1, 1 - 2 * ALPHA) * float(d.std(ddof=1)) / math.sqrt(self.n)
        p = max(sign_flip_p(d + bound, True), sign_flip_p(d - bound, False))
        return self.mean - half, self.mean + half, p

    def within(self, bound: float) -> Verdict:
        """The verdict on "|a − b| < ``bound``" (a and b close): held where the 90 % interval
        lies inside (−bound, bound) and both one-sided p ≤ 0.05 (TOST); not held where the
        95 % interval lies wholly outside and that side's p ≤ 0.05; else inconclusive."""
        if self.why:
            return INCONCLUSIVE
        low, high, p = self.tost(bound)
        if -bound < low and high < bound and p <= ALPHA:
            return HELD
        d = np.asarray(self.differences, dtype=np.float64)
        if self.low >= bound and sign_flip_p(d - bound, True) <= ALPHA:
            return NOT_HELD
        if self.high <= -bound and sign_flip_p(d + bound, False) <= ALPHA:
            return NOT_HELD
        return INCONCLUSIVE

    def text(self, scale: float = 1.0, digits: int = 1) -> str:
        f = f"{{:.{digits}f}}"
        if self.why:
            return f"undefined ({self.why}; n = {self.n})"
        body = (
            f"{f.format(scale * self.mean)} [{f.format(scale * self.low)}, "
            f"{f.format(scale * self.high)}], p = {self.p:.3g} (n = {self.n})"
        )
        if self.verdict == INCONCLUSIVE and self.interval_verdict != INCONCLUSIVE:
            body += f"; the interval alone: {self.interval_verdict}"
        return body

    def within_text(self, bound: float, scale: float = 1.0, digits: int = 1) -> str:
        """The closeness claim's numbers: the mean difference, its 90 % interval against the
        bound and the TOST p-value."""
        if self.why:
            return f"undefined ({self.why}; n = {self.n})"
        f = f"{{:.{digits}f}}"
        low, high, p = self.tost(bound)
        return (
            f"{f.format(scale * self.mean)}, 90 % [{f.format(scale * low)}, "
            f"{f.format(scale * high)}] vs ±{f.format(scale * bound)}, TOST p = {p:.3g} "
            f"(n = {self.n})"
        )


@dataclass(frozen=True)
class Correlation:
    """Spearman's ρ with a permutation p-value (two-sided), and the verdict on its sign."""

    rho: float
    p: float
    n: int
    verdict: Verdict
    why: str = ""

    @classmethod
    def of(
        cls, x: Sequence[float], y: Sequence[float], negative: bool = True, seed: int = 0
    ) -> Correlation:
        """``negative``: the claim is that y falls as x grows."""
        from scipy import stats

        xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if xs.shape != ys.shape or len(xs) < 3:
            raise ValueError("a correlation needs two equal-length series of 3+ points")
        nan = float("nan")
        if np.isnan(xs).any() or np.isnan(ys).any():
            return cls(nan, nan, len(xs), INCONCLUSIVE, "NaN in the series")
        if np.ptp(xs) == 0 or np.ptp(ys) == 0:
            return cls(nan, nan, len(xs), INCONCLUSIVE, "a constant series has no ranks to order")

        def standard(r: np.ndarray) -> np.ndarray:  # ranks centred and scaled, per row
            r = r - r.mean(axis=-1, keepdims=True)
            return r / np.linalg.norm(r, axis=-1, keepdims=True)

        rx, ry = standard(stats.rankdata(xs)), standard(stats.rankdata(ys))
        rho = float(rx @ ry)  # Pearson's r of the ranks
        tol = 1e-12
        if len(xs) <= 8:  # every permutation (the observed one among them)
            null = np.array(list(itertools.permutations(ry))) @ rx
            p = float((np.abs(null) >= abs(rho) - tol).mean())
        else:  # sampled: the observed ordering counts as one of N + 1
            rng = np.random.default_rng(seed)
            null = rng.permuted(np.tile(ry, (20_000, 1)), axis=1) @ rx
            p = float(((np.abs(null) >= abs(rho) - tol).sum() + 1) / (len(null) + 1))
        if p >= ALPHA:
            verdict: Verdict = INCONCLUSIVE
        else:
            verdict = HELD if (rho < 0) == negative else NOT_HELD
        return cls(rho, p, len(xs), verdict)

    def text(self) -> str:
        if self.why:
            return f"Spearman ρ undefined ({self.why}; n = {self.n})"
        return f"Spearman ρ = {self.rho:.2f}, p = {self.p:.3g} (n = {self.n})"


#: the markers around a report's "verdicts that changed" block (invisible in rendered Markdown)
CHANGES_BEGIN, CHANGES_END = "<!-- verdicts changed -->", "<!-- end of verdicts changed -->"


def changes_block(
    previous_text: str,
    previous: Mapping[str, str],
    current: Mapping[str, str],
    fresh: Sequence[str],
) -> list[str]:
    """A report's "verdicts that changed, and why" block, between ``CHANGES_BEGIN`` and
    ``CHANGES_END``. Where every verdict equals the one in the report it replaces
    (``previous``, parsed from ``previous_text``), the block of that report is kept, so a
    report regenerated from the same results is the committed one byte for byte; otherwise
    ``fresh`` (the changes against ``previous``, with the reason)."""
    if previous and dict(previous) == dict(current) and CHANGES_BEGIN in previous_text:
        kept = previous_text.split(CHANGES_BEGIN, 1)[1].split(CHANGES_END, 1)[0]
        return [CHANGES_BEGIN, *kept.strip("\n").splitlines(), CHANGES_END]
    lines = list(fresh)
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return [CHANGES_BEGIN, *lines, CHANGES_END]


def all_of(verdicts: Sequence[Verdict]) -> Verdict:
    """A claim made of parts: held where every part held, not held where any part did not,
    else inconclusive."""
    if not verdicts:
        raise ValueError("no verdicts to combine")
    if any(v == NOT_HELD for v in verdicts):
        return NOT_HELD
    return HELD if all(v == HELD for v in verdicts) else INCONCLUSIVE
