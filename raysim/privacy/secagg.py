"""Secure aggregation's effects, simulated: fixed-point encoding, sums modulo 2^k, dropouts, its
communication cost, and distributed integer noise for DP. No cryptography: the masks of
Bonawitz et al. 2017 ("Practical Secure Aggregation for Privacy-Preserving Machine Learning",
https://eprint.iacr.org/2017/281) cancel in the sum, so what the server learns is exactly the
sum modulo 2^k of the survivors' encoded vectors, and that sum is what is computed here.

- **Encoding** (Bonawitz et al., "Technical Intuition": inputs in Z_R): a value ``x`` becomes
  ``q = rint(x·2^f)`` (deterministic round-half-even), stored as ``q mod 2^k``. Deterministic
  because no Generator is passed, so a round is reproducible, each coordinate is within
  2^-(f+1) of ``x`` (half the error bound of stochastic rounding), and rounding is monotone, so
  ``|x| ≤ C`` gives ``|q| ≤ rint(C·2^f)``: the clip bound survives the encoding. Stochastic
  (randomised) rounding is unbiased but can carry a norm past its bound, which is why Agarwal,
  Kairouz, Liu 2021 ("The Skellam Mechanism", https://arxiv.org/abs/2110.04995) round
  conditionally; that is not modelled here.
- **Headroom**: as in ``raysim.algorithms.exact_sum`` the bound of the sum is checked before any
  sum is taken and an overflow is an error, never a wrap. Here the bound is exact:
  ``clients·(rint(C·2^f) + noise) < 2^(k-1)``, the signed range of k bits.
- **Dropouts** (Bell et al. 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic
  Overhead", https://eprint.iacr.org/2020/704, SecAgg+): the sum holds the survivors only, and a
  round with fewer than ``ceil(threshold·n)`` survivors yields nothing.
- **Distributed DP noise**: each client adds integer noise in the encoded domain; Skellam
  (Agarwal et al. 2021) sums to Skellam exactly, the discrete Gaussian (Canonne, Kamath,
  Steinke 2020, https://arxiv.org/abs/2004.00010, sampled; Kairouz, Liu, Steinke 2021,
  https://arxiv.org/abs/2102.06387, summed) approximately.

Pure numpy (no torch, no Ray).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: bytes of one key-agreement public key: 256-bit elliptic-curve keys (Bonawitz et al. 2017,
#: evaluation; with the share size below, their formula reproduces their stated 1.73× expansion
#: for n=2^10, m=2^20 and 1.98× for n=2^14, m=2^24 with 16-bit inputs)
KEY_BYTES = 32
#: bytes of one Shamir share (of a 256-bit secret key or mask seed), as above
SHARE_BYTES = 32
#: SecAgg+ neighbours per client: ``ceil(PLUS_DEGREE_PER_LOG2·log2 n)`` (Bell et al. 2020 prove
#: k = O(log n); 23 matches their concrete example of n=10^4 clients each talking to about 3% of
#: them, ≈300 ≈ 22.6·log2 10^4, with 5% corrupt and 5% dropouts)
PLUS_DEGREE_PER_LOG2 = 23.0
#: rounds of the semi-honest protocol (Bonawitz et al. 2017, "Protocol": advertise keys, share keys,
#: masked input collection, unmasking; the same four in Bell et al. 2020), one of them the upload
PROTOCOL_ROUNDS = 4


#: a client's metric under secure aggregation: the largest |value| it sends (real units), which
#: the server's check that the modular sum cannot wrap reads (the simulator's view, not a release)
PEAK_METRIC = "secagg_peak"


class SecAggOverflow(ValueError):
    """A secure sum could wrap modulo 2^k: too many clients for the bits, or a vector above its
    clip bound. A ``ValueError`` (a configuration or clipping fault, found before any sum is
    taken), not ``exact_sum.SumOverflow``: that one is a ``Diverged``, which a driver reports as
    training that diverged."""


@dataclass(frozen=True, kw_only=True)
class SecAggConfig:
    """Secure aggregation's parameters (keyword-only: ``clip`` has no default)."""

    #: k: sums are taken modulo 2^k
    modulus_bits: int = 32
    #: f: a value x is encoded as rint(x·2^f)
    scale_bits: int = 16
    #: C: every client's vector has L2 norm ≤ C, so every coordinate |x| ≤ C
    clip: float
    #: SecAgg+ dropout threshold: at least ceil(threshold·n) of the n clients that started the
    #: round must survive, or the round yields no update
    threshold: float = 0.5

    def __post_init__(self) -> None:
        k, f = self.modulus_bits, self.scale_bits
        if not _is_int(k) or not 8 <= k <= 62:
            raise ValueError(f"secagg modulus_bits must be an integer in [8, 62], got {k!r}")
        if not _is_int(f) or not 0 <= f < k:
            raise ValueError(
                f"secagg scale_bits must be an integer in [0, modulus_bits={k}), got {f!r}"
            )
        if not isinstance(self.clip, numbers.Real) or not (
            math.isfinite(self.clip) and self.clip > 0
        ):
            raise ValueError(f"secagg clip must be a finite number > 0, got {self.clip!r}")
        t = self.threshold
        if not isinstance(t, numbers.Real) or not 0 < t <= 1:
            raise ValueError(f"secagg threshold must be in (0, 1], got {t!r}")


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _clip_units(cfg: SecAggConfig) -> int:
    """The largest |encoded value| of a coordinate within the clip bound: rint(C·2^f)."""
    return int(np.rint(math.ldexp(float(cfg.clip), cfg.scale_bits)))


def _noise_units(cfg: SecAggConfig, noise_bound: float) -> int:
    if not (math.isfinite(noise_bound) and noise_bound >= 0):
        raise ValueError(f"noise_bound must be a finite number >= 0, got {noise_bound!r}")
    return math.floor(math.ldexp(float(noise_bound), cfg.scale_bits))


def max_clients(cfg: SecAggConfig, noise_bound: float = 0.0) -> int:
    """The most clients whose sum cannot wrap: ``(2^(k-1) - 1) // (rint(C·2^f) + noise·2^f)``
    (0 when one client alone does not fit; the int64 maximum when every value encodes to 0)."""
    per_client = _clip_units(cfg) + _noise_units(cfg, noise_bound)
    if per_client == 0:
        return np.iinfo(np.int64).max
    return ((1 << (cfg.modulus_bits - 1)) - 1) // per_client


def check_headroom(cfg: SecAggConfig, clients: int, noise_bound: float = 0.0) -> None:
    """Refuse, before any work, a round whose sum could wrap (Bonawitz et al. 2017, "Technical
    Intuition": the sum must fit Z_R). With every coordinate ``|x| ≤ C`` and every client's
    integer noise ``≤ noise_bound·2^f``, the sum's coordinates lie within
    ``±clients·(rint(C·2^f) + ⌊noise_bound·2^f⌋)``, which must stay below 2^(k-1), the signed
    range. ``SecAggOverflow``
    (one line: clients, C, k, f and the largest client count that fits) otherwise."""
    if not _is_int(clients) or clients < 1:
        raise ValueError(f"secagg needs a client count >= 1, got {clients!r}")
    fits = max_clients(cfg, noise_bound)
    if clients > fits:
        noise = f" + noise bound {noise_bound:g}" if noise_bound else ""
        raise SecAggOverflow(
            f"a secure sum of {clients} clients with clip C={cfg.clip:g}{noise} could wrap "
            f"modulo 2^{cfg.modulus_bits} at scale 2^{cfg.scale_bits}: at most {fits} clients "
            "fit (raise modulus_bits, lower scale_bits or clip)"
        )


def encode(x: np.ndarray, cfg: SecAggConfig) -> np.ndarray:
    """Fixed point modulo 2^k (Bonawitz et al. 2017, "Technical Intuition"): int64
    ``rint(x·2^f) mod 2^k`` in [0, 2^k), negatives as in two's complement. A value whose encoding
    leaves the signed range [-2^(k-1), 2^(k-1)) is ``SecAggOverflow``; non-finite values
    are ``ValueError``."""
    q = np.rint(np.ldexp(np.asarray(x, dtype=np.float64), cfg.scale_bits))
    if q.size:
        if not np.isfinite(q).all():
            raise ValueError("secagg encodes finite values only")
        half = math.ldexp(1.0, cfg.modulus_bits - 1)
        lo, hi = float(q.min()), float(q.max())
        if lo < -half or hi >= half:
            bad = hi if hi >= half else lo
            raise SecAggOverflow(
                f"a value {math.ldexp(bad, -cfg.scale_bits):.6g} cannot be encoded in "
                f"{cfg.modulus_bits} bits at scale 2^{cfg.scale_bits} (x·2^f must lie in "
                f"[-2^{cfg.modulus_bits - 1}, 2^{cfg.modulus_bits - 1}))"
            )
    return q.astype(np.int64) & _mask(cfg)


def _mask(cfg: SecAggConfig) -> int:
    return (1 << cfg.modulus_bits) - 1


def modular_sum(encoded: Sequence[np.ndarray], cfg: SecAggConfig) -> np.ndarray:
    """``Σ encoded mod 2^k`` (int64 in [0, 2^k)): what the server learns once the masks cancel
    (Bonawitz et al. 2017, "Technical Intuition"). Each term must be an integer array in
    [0, 2^k); with k ≤ 62 two terms add without leaving int64, and the sum is reduced after
    every term."""
    if len(encoded) == 0:
        raise ValueError("a modular sum needs at least one term")
    mask = _mask(cfg)
    total: np.ndarray | None = None
    for e in encoded:
        e = np.asarray(e)
        if not np.issubdtype(e.dtype, np.integer):
            raise ValueError(f"a modular sum takes integer arrays, got {e.dtype}")
        if e.size and (int(e.min()) < 0 or int(e.max()) > mask):
            raise ValueError(f"a modular sum's terms must lie in [0, 2^{cfg.modulus_bits})")
        e = e.astype(np.int64, copy=False)
        if total is None:
            total = e.astype(np.int64, copy=True)
        elif e.shape != total.shape:
            raise ValueError(f"cannot sum encoded vectors of shapes {total.shape} and {e.shape}")
        else:
            total += e
            total &= mask
    return total


def decode(total: np.ndarray, cfg: SecAggConfig) -> np.ndarray:
    """float64 of a value modulo 2^k read as signed: ``[2^(k-1), 2^k)`` is negative; times 2^-f.
    Exact wherever |value| < 2^53 units (always for k ≤ 54)."""
    t = np.asarray(total, dtype=np.int64)
    signed = np.where(t >= (1 << (cfg.modulus_bits - 1)), t - (1 << cfg.modulus_bits), t)
    return np.ldexp(signed.astype(np.float64), -cfg.scale_bits)


def required_survivors(cfg: SecAggConfig, clients: int) -> int:
    """``ceil(threshold·clients)`` (at least 1), tolerant of float error in ``threshold·n``."""
    return max(1, math.ceil(cfg.threshold * clients - 1e-9))


def secure_sum(
    vectors: Sequence[np.ndarray],
    cfg: SecAggConfig,
    survivors: Sequence[bool] | None = None,
    *,
    noise: Sequence[np.ndarray] | None = None,
) -> np.ndarray | None:
    """The sum the server learns (float64): the survivors' vectors encoded, summed modulo 2^k,
    decoded; ``None`` when fewer than ``ceil(threshold·n)`` of the n clients survive (Bell et al.
    2020, SecAgg+: a dropped client's vector is not in the sum, and a round short of the
    threshold cannot be unmasked). ``noise``: one integer array per client (units of 2^-f, e.g.
    ``distributed_noise``), added to its encoded vector; a dropped client's noise leaves with it.

    Before any sum: ``check_headroom`` for the n clients that started (and the largest |noise|
    drawn), then every vector's max |x| against C. A value above C by less than the encoding's
    resolution (a float32 rounding of a clipped vector) encodes to the same integer and passes;
    anything more is ``SecAggOverflow``, never a silent wrap."""
    n = len(vectors)
    if n == 0:
        raise ValueError("a secure sum needs at least one client")
    if survivors is None:
        survivors = [True] * n
    if len(survivors) != n:
        raise ValueError(f"secure_sum got {n} vectors but {len(survivors)} survivor flags")
    if noise is not None and len(noise) != n:
        raise ValueError(f"secure_sum got {n} vectors but {len(noise)} noise arrays")
    noise_peak = 0
    if noise is not None:
        for e in noise:
            e = np.asarray(e)
            if not np.issubdtype(e.dtype, np.integer):
                raise ValueError(f"secure_sum's noise must be integer arrays, got {e.dtype}")
            if e.size:
                noise_peak = max(noise_peak, int(np.abs(e.astype(np.int64)).max()))
    check_headroom(cfg, n, math.ldexp(noise_peak, -cfg.scale_bits))
    bound = _clip_units(cfg)
    for j, v in enumerate(vectors):
        v = np.asarray(v, dtype=np.float64)
        if not v.size:
            continue
        peak = float(np.abs(v).max())
        if not math.isfinite(peak):
            raise ValueError(f"secure_sum: client {j}'s vector is not finite")
        if np.rint(math.ldexp(peak, cfg.scale_bits)) > bound:
            raise SecAggOverflow(
                f"secure_sum: client {j}'s vector reaches |x| = {peak:.6g}, above its clip bound "
                f"C={cfg.clip:g}: clip before secure aggregation (it would wrap modulo "
                f"2^{cfg.modulus_bits})"
            )
    alive = [j for j in range(n) if survivors[j]]
    if len(alive) < required_survivors(cfg, n):
        return None
    terms = []
    for j in alive:
        q = encode(vectors[j], cfg)
        if noise is not None:
            e = np.asarray(noise[j]).astype(np.int64)
            if e.shape != q.shape:
                raise ValueError(f"client {j}'s noise has shape {e.shape}, its vector {q.shape}")
            q = (q + (e & _mask(cfg))) & _mask(cfg)
        terms.append(q)
    return decode(modular_sum(terms, cfg), cfg)


@dataclass(frozen=True)
class SecAggCost:
    """One client's traffic for one securely aggregated upload."""

    bytes_up_per_client: int
    bytes_down_per_client: int
    #: communication rounds added to a plain upload
    extra_rounds: int


def plus_degree(clients: int) -> int:
    """SecAgg+ neighbours per client: ``min(n-1, ceil(PLUS_DEGREE_PER_LOG2·log2 n))`` (Bell et
    al. 2020, SecAgg+: a Harary graph of degree O(log n); complete, i.e. SecAgg, when that
    reaches n-1)."""
    if clients <= 1:
        return 0
    return min(clients - 1, math.ceil(PLUS_DEGREE_PER_LOG2 * math.log2(clients)))


def cost(
    cfg: SecAggConfig,
    clients: int,
    params: int,
    protocol: Literal["secagg", "secagg_plus"] = "secagg_plus",
) -> SecAggCost:
    """A per-client cost model of the semi-honest protocols (no consistency-check round).

    Bonawitz et al. 2017 (client performance analysis) give one client's traffic as
    ``2n·a_K + (5n-4)·a_S + m·R`` bits for n clients, m entries of R bits; split here as
    - up: its 2 public keys (advertise keys), 2 shares per other client (share keys: of its mask
      seed b_u and key s_u^SK, sent encrypted via the server), the masked vector of
      ``params·k`` bits, and n shares at unmasking;
    - down: the 2 keys of every other client and the 2 shares each other client sent it.
    The model download and the identity lists are left out (the same without secure
    aggregation, and small); so is the encryption's overhead per share.
    SecAgg+ (Bell et al. 2020) is the same with n-1 replaced by ``plus_degree(n)`` neighbours.
    Constants: ``KEY_BYTES`` = ``SHARE_BYTES`` = 32 (a_K = a_S = 256 bits, which reproduce the
    paper's 1.73× and 1.98× expansions); ``PLUS_DEGREE_PER_LOG2`` = 23 (Bell et al.'s example:
    ≈3% of 10^4 clients); ``PROTOCOL_ROUNDS`` = 4 (advertise keys, share keys, masked input,
    unmask), so 3 extra over a plain upload for both protocols."""
    if not _is_int(clients) or clients < 1:
        raise ValueError(f"secagg cost needs a client count >= 1, got {clients!r}")
    if not _is_int(params) or params < 0:
        raise ValueError(f"secagg cost needs a parameter count >= 0, got {params!r}")
    if protocol == "secagg":
        others = clients - 1
    elif protocol == "secagg_plus":
        others = plus_degree(clients)
    else:
        raise ValueError(f"secagg protocol must be 'secagg' or 'secagg_plus', got {protocol!r}")
    masked = -(-params * cfg.modulus_bits // 8)
    up = 2 * KEY_BYTES + 2 * others * SHARE_BYTES + masked + (others + 1) * SHARE_BYTES
    down = 2 * others * KEY_BYTES + 2 * others * SHARE_BYTES
    return SecAggCost(up, down, PROTOCOL_ROUNDS - 1)


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    return (int(shape),) if _is_int(shape) else tuple(int(s) for s in shape)


def skellam_noise(
    shape: int | tuple[int, ...], variance: float, rng: np.random.Generator
) -> np.ndarray:
    """int64 symmetric Skellam noise of the given variance: ``Poisson(v/2) - Poisson(v/2)``
    (Agarwal, Kairouz, Liu 2021, the Skellam mechanism); a sum of independent Skellams is
    Skellam (variances add)."""
    if not (math.isfinite(variance) and variance >= 0):
        raise ValueError(f"skellam variance must be a finite number >= 0, got {variance!r}")
    lam = variance / 2
    shape = _shape(shape)
    return rng.poisson(lam, shape).astype(np.int64) - rng.poisson(lam, shape).astype(np.int64)


def _discrete_laplace(size: int, t: int, rng: np.random.Generator) -> np.ndarray:
    """``P(y) ∝ exp(-|y|/t)`` on the integers: the difference of two geometric variables
    on {0, 1, ...} with success probability ``1 - exp(-1/t)``."""
    p = -math.expm1(-1.0 / t)
    return rng.geometric(p, size).astype(np.int64) - rng.geometric(p, size).astype(np.int64)


def discrete_gaussian_noise(
    shape: int | tuple[int, ...], sigma: float, rng: np.random.Generator
) -> np.ndarray:
    """int64 discrete Gaussian ``P(y) ∝ exp(-y²/(2σ²))`` on the integers (Canonne, Kamath,
    Steinke 2020, Algorithm 3): draw Y from the discrete Laplace of scale ``t = ⌊σ⌋+1``, accept
    with probability ``exp(-(|Y| - σ²/t)²/(2σ²))``, redraw the rejected entries (vectorised).
    Their Algorithms 1–2 make each step exact in rational arithmetic; here the discrete Laplace
    comes from numpy's geometric sampler and the acceptance test compares a float64 uniform to
    a float64 exp, an approximation of order 2^-53 per draw. Variance ≤ σ², equal to within
    a relative 1e-15 for σ ≥ 1 (their bound on its variance)."""
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"discrete gaussian sigma must be a finite number >= 0, got {sigma!r}")
    shape = _shape(shape)
    size = math.prod(shape)
    out = np.zeros(size, np.int64)
    if sigma == 0 or size == 0:
        return out.reshape(shape)
    t = math.floor(sigma) + 1
    var = sigma * sigma
    pending = np.arange(size)
    while pending.size:
        y = _discrete_laplace(pending.size, t, rng)
        gap = np.abs(y) - var / t
        accept = rng.random(pending.size) < np.exp(-(gap * gap) / (2 * var))
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out.reshape(shape)


def integer_noise(
    kind: Literal["skellam", "discrete_gaussian"],
    shape: int | tuple[int, ...],
    stddev: float,
    cfg: SecAggConfig,
    rng: np.random.Generator,
) -> np.ndarray:
    """int64 noise in the encoded domain (units of 2^-f) of standard deviation ``stddev`` in real
    units: Skellam of variance (stddev·2^f)², or the discrete Gaussian of σ = stddev·2^f."""
    if not (math.isfinite(stddev) and stddev >= 0):
        raise ValueError(f"stddev must be a finite number >= 0, got {stddev!r}")
    sigma = math.ldexp(float(stddev), cfg.scale_bits)
    if kind == "skellam":
        return skellam_noise(shape, sigma * sigma, rng)
    if kind == "discrete_gaussian":
        return discrete_gaussian_noise(shape, sigma, rng)
    raise ValueError(
        f"distributed noise kind must be 'skellam' or 'discrete_gaussian', got {kind!r}"
    )


def distributed_noise(
    kind: Literal["skellam", "discrete_gaussian"],
    shape: int | tuple[int, ...],
    total_stddev: float,
    clients: int,
    cfg: SecAggConfig,
    rng: np.random.Generator,
) -> np.ndarray:
    """One client's share of integer noise in the encoded domain (units of 2^-f), such that the
    sum over ``clients`` has standard deviation ``total_stddev`` in real units (e.g. z·C): each
    client adds variance ``(total_stddev·2^f)² / clients``.

    Skellam: the sum is exactly Skellam of the total variance (Agarwal et al. 2021). Discrete
    Gaussian: a sum of discrete Gaussians is not itself one, but close to the discrete Gaussian
    of the summed variance when each σ is a few units or more (Kairouz, Liu, Steinke 2021 bound
    the difference); its variance is the sum of the shares' to within that. If clients drop out,
    only the survivors' noise is in the sum (it is then below ``total_stddev``)."""
    if not _is_int(clients) or clients < 1:
        raise ValueError(f"distributed noise needs a client count >= 1, got {clients!r}")
    if not (math.isfinite(total_stddev) and total_stddev >= 0):
        raise ValueError(f"total_stddev must be a finite number >= 0, got {total_stddev!r}")
    return integer_noise(kind, shape, total_stddev / math.sqrt(clients), cfg, rng)
