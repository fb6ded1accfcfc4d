"""Secure aggregation's effects (raysim.privacy.secagg): fixed point modulo 2^k, overflow refused
rather than wrapped, dropouts, distributed integer noise, and the cost model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysim.privacy.secagg import (
    KEY_BYTES,
    SHARE_BYTES,
    SecAggConfig,
    SecAggOverflow,
    check_headroom,
    cost,
    decode,
    discrete_gaussian_noise,
    distributed_noise,
    encode,
    max_clients,
    modular_sum,
    plus_degree,
    secure_sum,
    skellam_noise,
)


def vectors(rng: np.random.Generator, n: int, d: int, clip: float) -> list[np.ndarray]:
    """n float32 vectors of both signs, each coordinate within ``clip`` (some exactly ±clip)."""
    out = [rng.uniform(-clip, clip, d).astype(np.float32) for _ in range(n)]
    out[0][:2] = [clip, -clip]
    return out


# --- fixed point modulo 2^k -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "k", "f", "clip"),
    [(3, 32, 16, 1.0), (500, 32, 16, 1.0), (2000, 62, 40, 4.0), (40, 16, 6, 2.0)],
)
def test_modular_sum_equals_float_sum_within_fixed_point_bound(n, k, f, clip):
    cfg = SecAggConfig(modulus_bits=k, scale_bits=f, clip=clip)
    rng = np.random.default_rng(n + k)
    xs = vectors(rng, n, 64, clip)
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
    got = decode(modular_sum([encode(x, cfg) for x in xs], cfg), cfg)
    assert secure_sum(xs, cfg) == pytest.approx(got, abs=0)
    err = np.abs(got - exact)
    assert err.max() <= n * math.ldexp(1.0, -(f + 1))
    assert (exact < 0).any() and (exact > 0).any()


def test_encode_decode_round_trip():
    cfg = SecAggConfig(modulus_bits=20, scale_bits=8, clip=100.0)
    rng = np.random.default_rng(1)
    x = rng.uniform(-100, 100, 10_000)
    q = encode(x, cfg)
    assert q.dtype == np.int64 and q.min() >= 0 and q.max() < 2**20
    assert (q[x < -0.01] >= 2**19).all() and (q[x > 0.01] < 2**19).all()  # two's complement
    assert np.abs(decode(q, cfg) - x).max() <= 2.0**-9
    grid = np.arange(-(2**19), 2**19) / 256.0  # every representable value, exactly
    assert np.array_equal(decode(encode(grid, cfg), cfg), grid)
    assert encode(np.array([-1 / 256]), cfg)[0] == 2**20 - 1


def test_encode_refuses_a_value_outside_the_signed_range():
    cfg = SecAggConfig(modulus_bits=16, scale_bits=8, clip=1.0)
    assert decode(encode(np.array([127.99]), cfg), cfg)[0] == pytest.approx(127.99, abs=2**-9)
    assert encode(np.array([-128.0]), cfg)[0] == 2**15  # -2^15 is representable, +2^15 not
    with pytest.raises(SecAggOverflow, match="cannot be encoded in 16 bits"):
        encode(np.array([128.0]), cfg)
    with pytest.raises(SecAggOverflow, match="cannot be encoded in 16 bits"):
        encode(np.array([-128.01]), cfg)
    with pytest.raises(ValueError, match="finite"):
        encode(np.array([np.nan]), cfg)


# --- overflow is an error, never a wrap ---------------------------------------------------------


def test_too_many_clients_is_refused_where_the_modular_sum_would_wrap():
    cfg = SecAggConfig(modulus_bits=16, scale_bits=8, clip=1.0)  # 2^15 - 1 = 32767 units
    assert max_clients(cfg) == 127  # 127·256 = 32512 fits, 128·256 = 32768 = 2^15 does not
    fits = [np.ones(4, np.float32)] * 127
    assert np.array_equal(secure_sum(fits, cfg), np.full(4, 127.0))
    over = [np.ones(4, np.float32)] * 128
    # unchecked, the sum of 128 ones wraps to -128: the check below is what stops it
    wrapped = decode(modular_sum([encode(x, cfg) for x in over], cfg), cfg)
    assert np.array_equal(wrapped, np.full(4, -128.0))
    with pytest.raises(SecAggOverflow) as err:
        secure_sum(over, cfg)
    msg = str(err.value)
    assert "\n" not in msg
    for part in ("128 clients", "C=1", "2^16", "2^8", "at most 127 clients"):
        assert part in msg
    with pytest.raises(SecAggOverflow, match="at most 127"):
        check_headroom(cfg, 128)
    check_headroom(cfg, 127)


def test_headroom_counts_noise_and_refuses_before_any_work():
    cfg = SecAggConfig(modulus_bits=16, scale_bits=8, clip=1.0)
    # with noise up to 0.5 (128 units) per client: 384 units each, 32767 // 384 = 85
    assert max_clients(cfg, noise_bound=0.5) == 85
    check_headroom(cfg, 85, noise_bound=0.5)
    with pytest.raises(SecAggOverflow, match="at most 85"):
        check_headroom(cfg, 86, noise_bound=0.5)
    # the count is of clients that started: 128 started, 1 survived, still refused
    with pytest.raises(SecAggOverflow):
        secure_sum([np.zeros(2)] * 128, cfg, survivors=[True] + [False] * 127)
    # actual noise drawn is checked: 100 clients fit without noise, not with 128 units each
    noise = [np.full(2, 128, np.int64)] * 100
    assert secure_sum([np.zeros(2)] * 100, cfg) is not None
    with pytest.raises(SecAggOverflow):
        secure_sum([np.zeros(2)] * 100, cfg, noise=noise)


def test_a_vector_above_its_clip_bound_is_an_error_not_a_wrap():
    cfg = SecAggConfig(modulus_bits=16, scale_bits=8, clip=1.0)
    xs = [np.ones(3, np.float32) for _ in range(100)] + [np.full(3, 100.0, np.float32)]
    # each encodes (100·256 = 25600 < 2^15) but the sum, 51200 units, wraps past 2^15
    wrapped = decode(modular_sum([encode(x, cfg) for x in xs], cfg), cfg)
    assert not np.allclose(wrapped, 200.0) and (wrapped < 0).all()
    with pytest.raises(SecAggOverflow, match="client 100's vector reaches"):
        secure_sum(xs, cfg)
    with pytest.raises(SecAggOverflow, match="above its clip bound C=1"):
        secure_sum([np.array([0.5, -1.01])], cfg)  # 1.01·256 rounds to 259 > 256


def test_a_float32_rounding_of_the_clip_bound_passes():
    cfg = SecAggConfig(modulus_bits=32, scale_bits=16, clip=0.1)
    x = np.array([np.float32(0.1), -np.float32(0.1)])  # float32(0.1) > 0.1 by 1.5e-9
    assert float(x[0]) > 0.1
    assert secure_sum([x, x], cfg) == pytest.approx([0.2, -0.2], abs=2 * 2.0**-17)


# --- dropouts (SecAgg+ threshold) ---------------------------------------------------------------


def test_dropout_below_threshold_yields_none_at_or_above_the_survivors_sum():
    cfg = SecAggConfig(modulus_bits=32, scale_bits=16, clip=1.0, threshold=0.5)
    rng = np.random.default_rng(7)
    xs = vectors(rng, 10, 16, 1.0)
    alive = [True, False, True, True, False, False, True, False, False, False]  # 4 of 10
    assert secure_sum(xs, cfg, survivors=alive) is None
    alive[9] = True  # 5 of 10 = ceil(0.5·10)
    got = secure_sum(xs, cfg, survivors=alive)
    want = np.sum([xs[j].astype(np.float64) for j in range(10) if alive[j]], axis=0)
    assert np.abs(got - want).max() <= 5 * 2.0**-17
    everyone = np.sum(np.stack(xs).astype(np.float64), axis=0)
    assert np.abs(got - everyone).max() > 0.1  # the dropped clients are not in it
    assert np.abs(secure_sum(xs, cfg) - everyone).max() <= 10 * 2.0**-17
    # 0.28·25 is 7.000000000000001 in floating point: 7 survivors of 25 still suffice
    cfg7 = SecAggConfig(modulus_bits=32, scale_bits=16, clip=1.0, threshold=0.28)
    assert 0.28 * 25 > 7
    xs25 = vectors(rng, 25, 4, 1.0)
    assert secure_sum(xs25, cfg7, survivors=[True] * 7 + [False] * 18) is not None
    assert secure_sum(xs25, cfg7, survivors=[True] * 6 + [False] * 19) is None
    # threshold 1: any dropout loses the round; odd n rounds the threshold up
    assert (
        secure_sum(xs, SecAggConfig(clip=1.0, threshold=1.0), survivors=[True] * 9 + [False])
        is None
    )
    assert secure_sum(xs[:7], cfg, survivors=[True] * 3 + [False] * 4) is None
    assert secure_sum(xs[:7], cfg, survivors=[True] * 4 + [False] * 3) is not None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"modulus_bits": 7}, "modulus_bits"),
        ({"modulus_bits": 63}, "modulus_bits"),
        ({"scale_bits": 32}, "scale_bits"),
        ({"scale_bits": -1}, "scale_bits"),
        ({"clip": 0.0}, "clip"),
        ({"clip": float("inf")}, "clip"),
        ({"threshold": 0.0}, "threshold"),
        ({"threshold": 1.5}, "threshold"),
    ],
)
def test_config_refuses_each_field_out_of_range(kwargs, field):
    args = {"clip": 1.0, **kwargs}
    with pytest.raises(ValueError, match=field) as err:
        SecAggConfig(**args)
    assert "\n" not in str(err.value)


# --- integer noise ----------------------------------------------------------------------------


def assert_moments(x: np.ndarray, mean: float, var: float, fourth: float) -> None:
    """Sample mean and variance within 5 standard errors of ``mean`` and ``var``
    (``fourth``: the distribution's fourth central moment)."""
    n = x.size
    assert abs(x.mean() - mean) <= 5 * math.sqrt(var / n)
    assert abs(x.var() - var) <= 5 * math.sqrt((fourth - var * var) / n)


@pytest.mark.parametrize("variance", [0.5, 50.0, 4e6])
def test_skellam_mean_and_variance(variance):
    x = skellam_noise((400, 500), variance, np.random.default_rng(3))
    assert x.dtype == np.int64 and x.shape == (400, 500)
    # Skellam(μ, μ): cumulants κ2 = κ4 = 2μ = variance, so μ4 = κ4 + 3κ2²
    assert_moments(x.astype(np.float64), 0.0, variance, variance + 3 * variance**2)


@pytest.mark.parametrize("sigma", [0.8, 2.5, 40.0, 3000.0])
def test_discrete_gaussian_mean_and_variance(sigma):
    x = discrete_gaussian_noise(200_000, sigma, np.random.default_rng(4))
    assert x.dtype == np.int64
    # the exact variance and fourth moment of the discrete Gaussian, summed over its support
    support = np.arange(-int(12 * sigma) - 2, int(12 * sigma) + 3, dtype=np.float64)
    pmf = np.exp(-(support**2) / (2 * sigma**2))
    pmf /= pmf.sum()
    var, fourth = float((pmf * support**2).sum()), float((pmf * support**4).sum())
    if sigma >= 1:
        assert var == pytest.approx(sigma**2, rel=1e-12)
    assert_moments(x.astype(np.float64), 0.0, var, fourth)


def test_discrete_gaussian_matches_its_probability_mass():
    sigma, n = 0.8, 200_000
    x = discrete_gaussian_noise(n, sigma, np.random.default_rng(5))
    ys = np.arange(-3, 4)
    pmf = np.exp(-(np.arange(-10, 11) ** 2) / (2 * sigma**2))
    pmf = pmf[7:14] / pmf.sum()
    counts = np.array([(x == y).sum() for y in ys])
    assert np.all(np.abs(counts - n * pmf) <= 5 * np.sqrt(n * pmf * (1 - pmf)) + 1)
    assert discrete_gaussian_noise((2, 3), 0.0, np.random.default_rng(0)).tolist() == [[0] * 3] * 2


@pytest.mark.parametrize("kind", ["skellam", "discrete_gaussian"])
def test_distributed_noise_sums_to_the_requested_total_variance(kind):
    cfg = SecAggConfig(modulus_bits=32, scale_bits=8, clip=1.0)
    clients, d, total_stddev = 25, 40_000, 0.5
    rng = np.random.default_rng(6)
    shares = [distributed_noise(kind, d, total_stddev, clients, cfg, rng) for _ in range(clients)]
    assert all(s.dtype == np.int64 for s in shares)
    one = np.stack(shares).astype(np.float64)
    want_share = (total_stddev * 2**8) ** 2 / clients  # 16384 / 25 units² each
    assert one.var() == pytest.approx(want_share, rel=0.02)
    total = one.sum(axis=0)
    want = (total_stddev * 2**8) ** 2  # 16384 units²: stddev 0.5 in real units
    assert_moments(total, 0.0, want, 3 * want**2 + want)  # near Gaussian (Skellam: + κ4)
    # the same noise through the secure sum: the server sees Σx + Σnoise·2^-f
    xs = vectors(rng, clients, d, 1.0)
    got = secure_sum(xs, cfg, noise=shares)
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0) + total / 2**8
    assert np.abs(got - exact).max() <= clients * 2.0**-9
    assert np.std(got - np.sum(np.stack(xs).astype(np.float64), axis=0)) == pytest.approx(
        total_stddev, rel=0.02
    )


# --- cost model -------------------------------------------------------------------------------


def test_cost_grows_linearly_for_secagg_and_logarithmically_for_secagg_plus():
    cfg = SecAggConfig(modulus_bits=32, scale_bits=16, clip=1.0)
    params = 1_000_000

    def extra(n: int, protocol: str) -> int:
        c = cost(cfg, n, params, protocol)
        return c.bytes_up_per_client + c.bytes_down_per_client - params * 32 // 8

    # SecAgg: exactly linear, 2 keys + 5 shares per other client (Bonawitz et al.'s 2n·a_K +
    # (5n-4)·a_S less the n = 1 terms)
    per_client = 2 * KEY_BYTES + 5 * SHARE_BYTES
    for n in (10, 100, 1000, 10_000):
        assert extra(2 * n, "secagg") - extra(n, "secagg") == n * per_client
    assert extra(1, "secagg") == 2 * KEY_BYTES + SHARE_BYTES
    # SecAgg+: complete graph (= SecAgg) while c·log2 n ≥ n-1, then ~log n
    assert cost(cfg, 50, params, "secagg_plus") == cost(cfg, 50, params, "secagg")
    ns = [2**10, 2**15, 2**20, 2**25, 2**30]
    per_log = [extra(n, "secagg_plus") / math.log2(n) for n in ns]
    assert max(per_log) / min(per_log) < 1.05
    assert extra(2**20, "secagg_plus") < extra(2**10, "secagg_plus") * 2.05
    assert extra(2**20, "secagg") > 500 * extra(2**20, "secagg_plus")
    assert all(plus_degree(2 * n) > plus_degree(n) for n in ns)


@pytest.mark.parametrize("protocol", ["secagg", "secagg_plus"])
@pytest.mark.parametrize(("params", "k"), [(0, 8), (1, 13), (1001, 17), (10**6, 32), (7, 62)])
def test_cost_uploads_at_least_the_masked_vector(protocol, params, k):
    cfg = SecAggConfig(modulus_bits=k, scale_bits=0, clip=1.0)
    c = cost(cfg, 300, params, protocol)
    assert c.bytes_up_per_client >= params * k / 8
    assert c.bytes_up_per_client - math.ceil(params * k / 8) < 2_000_000  # keys and shares only
    assert c.bytes_down_per_client > 0 and c.extra_rounds == 3
    with pytest.raises(ValueError, match="protocol"):
        cost(cfg, 300, params, "plain")  # type: ignore[arg-type]


def test_cost_reproduces_bonawitz_expansion_factors():
    """Bonawitz et al. 2017 report 1.73× expansion (n = 2^10, m = 2^20 16-bit values) and 1.98×
    (n = 2^14, m = 2^24); the sum needs 16 + log2 n bits per value."""
    for n, m, want in [(2**10, 2**20, 1.73), (2**14, 2**24, 1.98)]:
        cfg = SecAggConfig(modulus_bits=16 + int(math.log2(n)), scale_bits=0, clip=1.0)
        c = cost(cfg, n, m, "secagg")
        assert (c.bytes_up_per_client + c.bytes_down_per_client) / (m * 2) == pytest.approx(
            want, abs=0.01
        )
