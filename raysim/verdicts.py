"""Verdicts on a paper's claims from a few seeds, with their statistics (issue 45).

Every paper's ``report.py`` decides its claims here, by one set of rules (``RULES``, printed once
in each report):

- a cell is summarised by its mean and its sample standard deviation (``ddof = 1``) over seeds;
- a claim that one method beats another compares them **paired by seed** (same seed, same data
  split, same clients): the mean difference, its 95 % t-interval, and an exact one-sided
  sign-flip permutation p-value (all 2^n sign assignments of the n differences);
- a claim is **held** where the whole 95 % interval lies on the claimed side of its margin,
  **not held** where the whole interval lies on the other side, and **inconclusive** otherwise
  (the seeds cannot tell); a correlation claim is held where Spearman's ρ has the claimed sign
  with an exact permutation p-value below 0.05, not held where it has the other sign with such a
  p-value, and inconclusive otherwise.

With 3 seeds the smallest one-sided sign-flip p-value is 1/8: such a p-value alone never decides,
which is why the interval does; 5 seeds give 1/32.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
Verdict = Literal["held", "not held", "inconclusive"]
#: the level of every interval and test here
LEVEL = 0.95

RULES = (
    "Verdicts: each cell is the mean ± sample standard deviation (ddof = 1) over seeds. A "
    "comparison pairs two methods seed by seed and gives the mean difference with its 95 % "
    "t-interval and an exact one-sided sign-flip permutation p-value. A claim is **held** when "
    "the whole interval lies on the claimed side of its margin, **not held** when it lies wholly "
    "on the other side, and **inconclusive** otherwise. A correlation claim uses Spearman's ρ "
    "with an exact (or, past 8 points, 20,000-draw) permutation p-value: held or not held at "
    "p < 0.05 by the sign of ρ, else inconclusive. A closeness claim (|a − b| below a bound) is "
    "held when the whole interval lies inside the bound, not held when it lies wholly outside. "
    "A claim of several parts is held when every part is, not held when any part is not."
)


@dataclass(frozen=True)
class Summary:
    """One cell over seeds: mean, sample standard deviation (ddof = 1; 0 for one seed), n."""

    mean: float
    sd: float
    n: int
    best: float

    @classmethod
    def of(cls, values: Sequence[float], higher_is_better: bool = True) -> Summary:
        a = np.asarray(values, dtype=np.float64)
        if not len(a):
            raise ValueError("no values to summarise")
        sd = float(a.std(ddof=1)) if len(a) > 1 else 0.0
        best = float(a.max() if higher_is_better else a.min())
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
    if len(d) > 20:
        raise ValueError("exact sign flips over more than 20 seeds: use a sampled test")
    observed = d.mean()
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    means = (signs * d).mean(axis=1)
    tol = 1e-12 * max(1.0, float(np.abs(d).max(initial=0.0)))
    extreme = means >= observed - tol if greater else means <= observed + tol
    return float(extreme.mean())


@dataclass(frozen=True)
class Paired:
    """``a − b`` paired by seed: mean difference, its 95 % interval, the one-sided p-value of
    the claimed direction, and the verdict on "a beats b by more than ``margin``"."""

    mean: float
    low: float
    high: float
    p: float
    n: int
    margin: float
    verdict: Verdict

    @classmethod
    def of(
        cls,
        a: Sequence[float],
        b: Sequence[float],
        margin: float = 0.0,
        greater: bool = True,
    ) -> Paired:
        """``greater``: the claim is a − b > margin; else a − b < margin."""
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
            raise ValueError("a paired comparison needs two equal-length runs of 2+ seeds")
        d = x - y
        mean, n = float(d.mean()), len(d)
        half = t_quantile(n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
        low, high = mean - half, mean + half
        p = sign_flip_p(d - margin, greater)
        above, below = low > margin, high < margin
        if greater:
            verdict: Verdict = HELD if above else NOT_HELD if below else INCONCLUSIVE
        else:
            verdict = HELD if below else NOT_HELD if above else INCONCLUSIVE
        return cls(mean, low, high, p, n, margin, verdict)

    def within(self, bound: float) -> Verdict:
        """The verdict on "|a − b| < ``bound``" (a and b close): held where the whole interval
        lies inside (−bound, bound), not held where it lies wholly outside, else inconclusive."""
        if -bound < self.low and self.high < bound:
            return HELD
        if self.low >= bound or self.high <= -bound:
            return NOT_HELD
        return INCONCLUSIVE

    def text(self, scale: float = 1.0, digits: int = 1) -> str:
        f = f"{{:.{digits}f}}"
        return (
            f"{f.format(scale * self.mean)} [{f.format(scale * self.low)}, "
            f"{f.format(scale * self.high)}], p = {self.p:.3g} (n = {self.n})"
        )


@dataclass(frozen=True)
class Correlation:
    """Spearman's ρ with a permutation p-value (two-sided), and the verdict on its sign."""

    rho: float
    p: float
    n: int
    verdict: Verdict

    @classmethod
    def of(
        cls, x: Sequence[float], y: Sequence[float], negative: bool = True, seed: int = 0
    ) -> Correlation:
        """``negative``: the claim is that y falls as x grows."""
        from scipy import stats

        xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if xs.shape != ys.shape or len(xs) < 3:
            raise ValueError("a correlation needs two equal-length series of 3+ points")

        def standard(r: np.ndarray) -> np.ndarray:  # ranks centred and scaled, per row
            r = r - r.mean(axis=-1, keepdims=True)
            return r / np.linalg.norm(r, axis=-1, keepdims=True)

        rx, ry = standard(stats.rankdata(xs)), standard(stats.rankdata(ys))
        rho = float(rx @ ry)  # Pearson's r of the ranks
        if len(xs) <= 8:  # every permutation
            perms = np.array(list(itertools.permutations(ry)))
        else:
            rng = np.random.default_rng(seed)
            perms = rng.permuted(np.tile(ry, (20_000, 1)), axis=1)
        null = perms @ rx  # a permutation of standard ranks stays standard
        p = float((np.abs(null) >= abs(rho) - 1e-12).mean())
        if p >= 1 - LEVEL:
            verdict: Verdict = INCONCLUSIVE
        else:
            verdict = HELD if (rho < 0) == negative else NOT_HELD
        return cls(rho, p, len(xs), verdict)

    def text(self) -> str:
        return f"Spearman ρ = {self.rho:.2f}, p = {self.p:.3g} (n = {self.n})"


def all_of(verdicts: Sequence[Verdict]) -> Verdict:
    """A claim made of parts: held where every part held, not held where any part did not,
    else inconclusive."""
    if not verdicts:
        raise ValueError("no verdicts to combine")
    if any(v == NOT_HELD for v in verdicts):
        return NOT_HELD
    return HELD if all(v == HELD for v in verdicts) else INCONCLUSIVE
