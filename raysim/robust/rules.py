"""Byzantine-robust aggregation rules on a round's client updates, one row each.

Every rule takes ``x``, an (n, d) array of the round's updates ordered by client id (so the
result never depends on arrival order or the number of workers), and returns one (d,) float32
vector; each computes in float64. ``assumption`` states what a rule needs of n and of f (the
adversaries it is set to tolerate) and ``check`` refuses a violation in one line.

The rules (their papers are in ``RULES``):

- ``krum`` (m = 1) and ``multi_krum`` (m ≥ 1): score_i = Σ of the squared distances to x_i's
  n − f − 2 nearest neighbours (Blanchard et al. 2017, §4; ``neighbours: byzfl`` takes n − f − 1,
  as byzfl does); Krum returns the lowest-scored update, Multi-Krum the mean of the m lowest
  (default m = n − f). Ties go to the lower client id.
- ``median``: coordinate-wise; with n even, the mean of the two middle values (Yin et al. 2018).
- ``trimmed_mean``: coordinate-wise, the f largest and f smallest values dropped (Yin et al.
  2018's β = f/n).
- ``bulyan``: θ = n − 2f updates chosen by Krum one after another (each time among those not
  yet chosen), then, coordinate by coordinate, the mean of the β = θ − 2f chosen values
  nearest their median (El Mhamdi et al. 2018, Algorithm 1).
- ``geometric_median``: RFA's smoothed Weiszfeld iteration (Pillutla et al. 2022, Algorithm 3)
  v ← Σ β_i x_i / Σ β_i, β_i = α_i / max(ν, ‖v − x_i‖), from the weighted mean (``init: mean``)
  or the origin (``init: zero``, byzfl's); stops after ``iterations`` or when v moves less than
  ``tolerance``·(1 + ‖v‖).
- ``centered_clipping``: v ← v + (1/n) Σ clip_τ(x_i − v), ``iterations`` times, from the
  previous round's aggregate (Karimireddy et al. 2021, Algorithm 2); an update at distance 0
  adds nothing.
- ``norm_bound``: each update scaled to norm ≤ M, then the method's own (weighted) mean (Sun et
  al. 2019); it needs no update but its own, so it runs on the workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np


class RobustRuleError(ValueError):
    """A rule's configuration breaks the rule's assumption (one line, naming the fix)."""


@dataclass(frozen=True)
class Rule:
    """A rule's paper and what it assumes of n updates and f adversaries."""

    name: str
    paper: str
    assumption: str
    valid: Callable[[int, int], bool]

    def check(self, n: int, f: int) -> None:
        """Refuse, in one line, ``n`` updates of which ``f`` may be adversarial."""
        if f < 0:
            raise RobustRuleError(f"robust.f must be >= 0, got {f}")
        if not self.valid(n, f):
            raise RobustRuleError(
                f"robust.rule {self.name} needs {self.assumption}; got n = {n} updates in a "
                f"round and f = {f}: sample more clients a round or lower robust.f"
            )


RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        Rule("krum", "Blanchard et al., NeurIPS 2017, https://arxiv.org/abs/1703.02757",
             "n > 2f + 2", lambda n, f: n > 2 * f + 2),
        Rule("multi_krum", "Blanchard et al., NeurIPS 2017, https://arxiv.org/abs/1703.02757",
             "n > 2f + 2", lambda n, f: n > 2 * f + 2),
        Rule("median", "Yin et al., ICML 2018, https://arxiv.org/abs/1803.01498",
             "n > 2f", lambda n, f: n > 2 * f),
        Rule("trimmed_mean", "Yin et al., ICML 2018, https://arxiv.org/abs/1803.01498",
             "n > 2f", lambda n, f: n > 2 * f),
        Rule("bulyan", "El Mhamdi et al., ICML 2018, https://arxiv.org/abs/1802.07927",
             "n >= 4f + 3", lambda n, f: n >= 4 * f + 3),
        Rule("geometric_median", "Pillutla et al., IEEE TSP 2022, https://arxiv.org/abs/1912.13445",
             "n > 2f", lambda n, f: n > 2 * f),
        Rule("centered_clipping", "Karimireddy et al., ICML 2021, https://arxiv.org/abs/2012.10333",
             "n > 2f", lambda n, f: n > 2 * f),
        Rule("norm_bound", "Sun et al., 2019, https://arxiv.org/abs/1911.07963",
             "n >= 1", lambda n, f: n >= 1),
    )
}  # fmt: skip


#: coordinates per chunk: a rule holds n × CHUNK float64 values at a time besides its input
#: (1,000 updates of 10^6 parameters are 4 GB of float32; a float64 copy would be 8 more)
CHUNK = 1 << 15


def _out(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, dtype=np.float32)


def columns(x: np.ndarray) -> Iterator[tuple[slice, np.ndarray]]:
    """``x``'s columns in chunks of ``CHUNK``, each as float64: (its slice, the chunk)."""
    for start in range(0, x.shape[1], CHUNK):
        part = slice(start, start + CHUNK)
        yield part, np.asarray(x[:, part], dtype=np.float64)


def by_columns(x: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """A coordinate-wise rule ``fn`` ((n, c) float64 → (c,)) over ``x``'s chunks, as float32."""
    out = np.empty(x.shape[1], dtype=np.float32)
    for part, chunk in columns(x):
        out[part] = fn(chunk)
    return out


def weighted_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Σ_i w_i·x_i in float64 (w: (n,) float64), chunk by chunk."""
    out = np.empty(x.shape[1], dtype=np.float64)
    for part, chunk in columns(x):
        out[part] = w @ chunk
    return out


def distances_to(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """‖x_i − v‖ for every row, float64."""
    sq = np.zeros(len(x))
    for part, chunk in columns(x):
        sq += ((chunk - v[part]) ** 2).sum(axis=1)
    return np.sqrt(sq)


def squared_distances(x: np.ndarray) -> np.ndarray:
    """(n, n) squared Euclidean distances, float64 (the Gram matrix summed chunk by chunk),
    exactly symmetric, 0 on the diagonal."""
    gram = np.zeros((len(x), len(x)))
    for _, chunk in columns(x):
        gram += chunk @ chunk.T
    sq = np.diag(gram).copy()
    d = sq[:, None] + sq[None, :] - 2.0 * gram
    d = np.maximum((d + d.T) / 2.0, 0.0)
    np.fill_diagonal(d, 0.0)
    return d


def krum_scores(dist: np.ndarray, f: int, neighbours: str = "paper") -> np.ndarray:
    """Each row's Σ of squared distances to its n − f − 2 (``paper``) or n − f − 1 (``byzfl``)
    nearest other rows."""
    n = len(dist)
    k = n - f - 2 if neighbours == "paper" else n - f - 1
    others = np.sort(dist + np.diag(np.full(n, np.inf)), axis=1)[:, : max(k, 0)]
    return others.sum(axis=1)


def krum_chosen(x: np.ndarray, f: int, m: int = 1, neighbours: str = "paper") -> list[int]:
    """The rows Krum (m = 1) or Multi-Krum picks: the m lowest scores, ties to the lower row."""
    scores = krum_scores(squared_distances(x), f, neighbours)
    return sorted(int(i) for i in np.argsort(scores, kind="stable")[:m])


def mean_of(x: np.ndarray, rows: list[int]) -> np.ndarray:
    """The mean of ``x``'s ``rows``, float32 (summed in float64)."""
    w = np.zeros(len(x))
    w[rows] = 1.0 / len(rows)
    return _out(weighted_rows(x, w))


def krum(x: np.ndarray, f: int, m: int = 1, neighbours: str = "paper") -> np.ndarray:
    """Krum (m = 1) or Multi-Krum: the mean of the m updates with the lowest scores."""
    return mean_of(x, krum_chosen(x, f, m, neighbours))


def median(x: np.ndarray) -> np.ndarray:
    return by_columns(x, lambda c: np.median(c, axis=0))


def trimmed_mean(x: np.ndarray, f: int) -> np.ndarray:
    n = len(x)
    return by_columns(x, lambda c: np.sort(c, axis=0)[f : n - f].mean(axis=0))


def bulyan_chosen(x: np.ndarray, f: int, neighbours: str = "paper") -> list[int]:
    """Bulyan's θ = n − 2f rows, each Krum's pick among the rows not yet picked."""
    dist = squared_distances(x)
    left, chosen = list(range(len(x))), []
    for _ in range(len(x) - 2 * f):
        sub = dist[np.ix_(left, left)]
        best = left[int(np.argmin(krum_scores(sub, f, neighbours)))]
        chosen.append(best)
        left.remove(best)
    return sorted(chosen)


def bulyan(x: np.ndarray, f: int, neighbours: str = "paper") -> np.ndarray:
    """El Mhamdi et al. 2018, Algorithm 1: θ = n − 2f updates by repeated Krum, then the
    coordinate-wise mean of the β = θ − 2f chosen values nearest their median."""
    s = np.asarray(x)[bulyan_chosen(x, f, neighbours)]
    beta = len(s) - 2 * f

    def nearest_mean(c: np.ndarray) -> np.ndarray:
        r = np.ascontiguousarray(c.T)  # a coordinate's θ values side by side: 2x faster
        far = np.abs(r - np.median(r, axis=1)[:, None])
        near = np.argpartition(far, beta - 1, axis=1)[:, :beta]  # the β nearest, in any order
        return np.take_along_axis(r, near, axis=1).mean(axis=1)

    return by_columns(s, nearest_mean)


def geometric_median(
    x: np.ndarray,
    weights: np.ndarray | None = None,
    nu: float = 1e-6,
    iterations: int = 100,
    tolerance: float = 1e-6,
    init: str = "mean",
) -> np.ndarray:
    """RFA's smoothed Weiszfeld iteration (module docstring)."""
    alpha = np.full(len(x), 1.0 / len(x)) if weights is None else np.asarray(weights, float)
    alpha = alpha / alpha.sum()
    v = weighted_rows(x, alpha) if init == "mean" else np.zeros(x.shape[1])
    for _ in range(iterations):
        beta = alpha / np.maximum(nu, distances_to(x, v))
        new = weighted_rows(x, beta / beta.sum())
        moved = np.linalg.norm(new - v)
        v = new
        if moved <= tolerance * (1.0 + np.linalg.norm(v)):
            break
    return _out(v)


def centered_clipping(
    x: np.ndarray, centre: np.ndarray, tau: float, iterations: int = 1
) -> np.ndarray:
    """Karimireddy et al. 2021's centred clipping about ``centre``:
    v + (1/n) Σ (x_i − v)·min(1, τ/‖x_i − v‖) = v + Σ s_i x_i/n − v·Σ s_i/n."""
    v = np.asarray(centre, dtype=np.float64).copy()
    n = len(x)
    for _ in range(iterations):
        norm = distances_to(x, v)
        scale = np.minimum(1.0, tau / np.where(norm > 0, norm, np.inf))
        v = v + weighted_rows(x, scale / n) - v * (scale.sum() / n)
    return _out(v)


def norm_bound(delta: np.ndarray, max_norm: float) -> np.ndarray:
    """One update scaled to norm ≤ ``max_norm`` (computed in float64)."""
    norm = float(np.linalg.norm(np.asarray(delta, dtype=np.float64)))
    if norm <= max_norm:
        return delta
    return (np.asarray(delta, dtype=np.float64) * (max_norm / norm)).astype(np.float32)
