"""raysim.privacy.accounting against dp-accounting's own accountants, built here independently."""

from __future__ import annotations

import json
import math
import time

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from raysim.privacy import accounting
from raysim.privacy.accounting import (
    Accountant,
    Schedule,
    TargetNotReachable,
    calibrate,
    delta_noise_multiplier,
    epsilon,
    gaussian_event,
    local_epsilon,
)

REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
ADD_OR_REMOVE_ONE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
DELTA = 1e-5
WOR = Schedule(100, 10, "without_replacement")
POISSON = Schedule(1000, 20, "poisson")


def rdp_reference(event, relation, steps: int, delta: float = DELTA) -> float:
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    acc.compose(event, steps)
    return acc.get_epsilon(delta)


def pld_reference(event, steps: int, delta: float = DELTA, one_at_a_time: bool = False) -> float:
    acc = pld_privacy_accountant.PLDAccountant(
        ADD_OR_REMOVE_ONE, value_discretization_interval=accounting.PLD_DISCRETIZATION
    )
    if one_at_a_time:
        for _ in range(steps):
            acc.compose(event)
    else:
        acc.compose(event, steps)
    return acc.get_epsilon(delta)


def wor_event(n: int, s: int, sigma: float):
    return dp_accounting.SampledWithoutReplacementDpEvent(
        n, s, dp_accounting.GaussianDpEvent(sigma)
    )


def poisson_event(q: float, sigma: float):
    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))


# ----------------------------------------------------------------------------- events, σ
def test_events_are_dp_accountings_with_the_sensitivity_of_each_relation():
    assert gaussian_event(WOR, 1.3) == wor_event(100, 10, 0.65)
    assert gaussian_event(POISSON, 1.3) == poisson_event(0.02, 1.3)


def test_without_replacement_accounts_sigma_half_z():
    z, steps = 1.3, 50
    ours = epsilon(WOR, z, steps, DELTA)
    assert ours == rdp_reference(wor_event(100, 10, z / 2), REPLACE_ONE, steps)
    assert ours > rdp_reference(wor_event(100, 10, z), REPLACE_ONE, steps) * 1.5


# ------------------------------------------------------------------------- against dp-accounting
@pytest.mark.parametrize("steps", [1, 10, 250])
def test_rdp_without_replacement_equals_dp_accounting(steps):
    z = 1.1
    expected = rdp_reference(wor_event(100, 10, z / 2), REPLACE_ONE, steps)
    assert epsilon(WOR, z, steps, DELTA) == expected
    acc = Accountant(WOR, z, DELTA)
    assert acc.epsilon_after(steps) == expected
    assert acc.step(steps) == expected and acc.steps == steps and acc.epsilon() == expected


@pytest.mark.parametrize("steps", [1, 10, 250])
def test_rdp_poisson_equals_dp_accounting(steps):
    z = 0.9
    expected = rdp_reference(poisson_event(0.02, z), ADD_OR_REMOVE_ONE, steps)
    assert epsilon(POISSON, z, steps, DELTA) == expected
    acc = Accountant(POISSON, z, DELTA)
    for _ in range(steps):
        got = acc.step()
    assert got == expected


@pytest.mark.parametrize("steps", [1, 20, 300])
def test_pld_poisson_equals_dp_accounting(steps):
    z = 0.9
    event = poisson_event(0.02, z)
    expected = pld_reference(event, steps)
    assert epsilon(POISSON, z, steps, DELTA, "pld") == expected
    # the per-round accountant composes one aggregation at a time and truncates pessimistically:
    # never below dp-accounting's, and close to it
    per_round = Accountant(POISSON, z, DELTA, "pld").epsilon_after(steps)
    assert expected <= per_round <= expected * (1 + 1e-5)
    # PLD is tighter than RDP's conversion
    assert expected < epsilon(POISSON, z, steps, DELTA, "rdp")


def test_pld_accountant_bounds_dp_accounting_composed_one_event_at_a_time():
    z = 0.9
    event = poisson_event(0.02, z)
    acc = Accountant(POISSON, z, DELTA, "pld")
    got = [acc.step() for _ in range(40)]
    want = [pld_reference(event, k, one_at_a_time=True) for k in (1, 2, 3, 40)]
    for ours, theirs in zip([*got[:3], got[39]], want, strict=True):
        assert theirs <= ours <= theirs * (1 + 1e-5)


# ----------------------------------------------------------------------------- shape of ε
@pytest.mark.parametrize("schedule,method", [(WOR, "rdp"), (POISSON, "rdp"), (POISSON, "pld")])
def test_epsilon_grows_with_steps_and_shrinks_with_noise(schedule, method):
    by_steps = [epsilon(schedule, 1.0, k, DELTA, method) for k in (1, 10, 100)]
    assert by_steps[0] < by_steps[1] < by_steps[2]
    by_noise = [epsilon(schedule, z, 30, DELTA, method) for z in (0.7, 1.0, 2.0)]
    assert by_noise[0] > by_noise[1] > by_noise[2] > 0


@pytest.mark.parametrize("schedule,method", [(WOR, "rdp"), (POISSON, "rdp"), (POISSON, "pld")])
def test_no_step_is_free_and_no_noise_is_infinite(schedule, method):
    assert epsilon(schedule, 1.0, 0, DELTA, method) == 0.0
    assert epsilon(schedule, 0.0, 0, DELTA, method) == 0.0
    assert epsilon(schedule, 0.0, 1, DELTA, method) == math.inf
    acc = Accountant(schedule, 0.0, DELTA, method)
    assert acc.epsilon() == 0.0
    assert acc.step() == math.inf and acc.epsilon_after(5) == math.inf
    assert Accountant(schedule, 1.0, DELTA, method).step(0) == 0.0


def test_step_count_is_the_same_as_single_steps():
    for method in ("rdp", "pld"):
        one = Accountant(POISSON, 1.0, DELTA, method)
        for _ in range(6):
            one.step()
        many = Accountant(POISSON, 1.0, DELTA, method)
        many.step(2)
        assert many.step(4) == one.epsilon()
        # previewing does not record, nor change later answers
        fresh = Accountant(POISSON, 1.0, DELTA, method)
        preview = fresh.epsilon_after(6)
        assert fresh.steps == 0 and fresh.epsilon() == 0.0
        assert preview == one.epsilon() == fresh.step(6)


# ----------------------------------------------------------------------------- refusals
def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    return message


def test_pld_with_fixed_size_sampling_is_refused_in_one_line():
    for call in (
        lambda: epsilon(WOR, 1.0, 10, DELTA, "pld"),
        lambda: Accountant(WOR, 1.0, DELTA, "pld"),
        lambda: calibrate(3.0, DELTA, 10, WOR, "pld"),
    ):
        with pytest.raises(ValueError) as err:
            call()
        message = one_line(err)
        assert "without_replacement" in message and "poisson" in message and "rdp" in message


@pytest.mark.parametrize(
    "args",
    [(0, 1), (10, 0), (10, 11), (10, -1), (10, 5, "uniform"), (10.0, 5), (10, True)],
)
def test_bad_schedules_are_refused_in_one_line(args):
    with pytest.raises(ValueError) as err:
        Schedule(*args)
    one_line(err)


def test_bad_arguments_are_refused_in_one_line():
    for call in (
        lambda: epsilon(POISSON, -1.0, 1, DELTA),
        lambda: epsilon(POISSON, math.nan, 1, DELTA),
        lambda: epsilon(POISSON, 1.0, -1, DELTA),
        lambda: epsilon(POISSON, 1.0, 1, 0.0),
        lambda: epsilon(POISSON, 1.0, 1, 1.0),
        lambda: epsilon(POISSON, 1.0, 1, DELTA, "gdp"),
        lambda: Accountant(POISSON, 1.0, DELTA).step(-1),
    ):
        with pytest.raises(ValueError) as err:
            call()
        one_line(err)


# ----------------------------------------------------------------------------- calibration
@pytest.mark.parametrize(
    "schedule,method,target,steps",
    [(POISSON, "rdp", 2.0, 200), (POISSON, "pld", 2.0, 200), (POISSON, "rdp", 8.0, 5)],
)
def test_calibrate_meets_the_target_with_the_smallest_noise(schedule, method, target, steps):
    z = calibrate(target, DELTA, steps, schedule, method)
    assert 0 < z < 100
    assert epsilon(schedule, z, steps, DELTA, method) <= target
    assert epsilon(schedule, 0.99 * z, steps, DELTA, method) > target
    # and the per-round accountant agrees that the run stays within it
    assert Accountant(schedule, z, DELTA, method).epsilon_after(steps) <= target


@pytest.mark.matrix
def test_calibrate_meets_the_target_for_fixed_size_sampling():
    z = calibrate(5.0, DELTA, 3, WOR)
    assert epsilon(WOR, z, 3, DELTA) <= 5.0 < epsilon(WOR, 0.99 * z, 3, DELTA)
    assert Accountant(WOR, z, DELTA).step(3) <= 5.0


def test_an_unreachable_target_is_refused_in_one_line():
    with pytest.raises(TargetNotReachable) as err:
        calibrate(1e-3, DELTA, 100, POISSON, max_noise_multiplier=2.0)
    message = one_line(err)
    assert isinstance(err.value, ValueError)
    for part in ("0.001", "1e-05", "100 aggregations", "max_noise_multiplier=2", "fewer rounds"):
        assert part in message


@pytest.mark.parametrize(
    "target,delta,steps", [(0.0, DELTA, 10), (-1.0, DELTA, 10), (1.0, 0.0, 10), (1.0, 1.0, 10),
                           (1.0, DELTA, 0)]
)  # fmt: skip
def test_calibrate_refuses_bad_targets_in_one_line(target, delta, steps):
    with pytest.raises(ValueError) as err:
        calibrate(target, delta, steps, POISSON)
    assert not isinstance(err.value, TargetNotReachable)
    one_line(err)


# ----------------------------------------------------------------------------- adaptive clipping
def test_delta_noise_multiplier_is_andrew_et_al_split():
    z, sb = 1.0, 2.5
    z_delta = delta_noise_multiplier(z, sb)
    assert z_delta == pytest.approx((z**-2 - (2 * sb) ** -2) ** -0.5, rel=1e-15)
    assert z_delta > z
    # the sum (multiplier z_Δ) and the centred count (multiplier 2σ_b) compose to one Gaussian z
    pair = dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(z_delta), dp_accounting.GaussianDpEvent(2 * sb)]
    )
    assert rdp_reference(pair, ADD_OR_REMOVE_ONE, 7) == pytest.approx(
        rdp_reference(dp_accounting.GaussianDpEvent(z), ADD_OR_REMOVE_ONE, 7), rel=1e-12
    )
    assert delta_noise_multiplier(0.0, 0.0) == 0.0
    assert delta_noise_multiplier(0.0, 3.0) == 0.0


@pytest.mark.parametrize("z,sb", [(1.0, 0.5), (1.0, 0.2), (2.0, 0.0)])
def test_delta_noise_multiplier_refuses_an_impossible_split(z, sb):
    with pytest.raises(ValueError) as err:
        delta_noise_multiplier(z, sb)
    assert "count_stddev" in one_line(err)


# ----------------------------------------------------------------------------- local DP
@pytest.mark.parametrize("z,k", [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_local_epsilon_is_k_gaussians_of_half_the_multiplier(z, k):
    ours = local_epsilon(z, k, DELTA)
    assert ours == rdp_reference(dp_accounting.GaussianDpEvent(z / 2), REPLACE_ONE, k)
    # k Gaussians of multiplier σ are exactly one of σ/√k: the analytic ε bounds RDP's from below
    exact = dp_accounting.get_epsilon_gaussian((z / 2) / math.sqrt(k), DELTA)
    assert exact <= ours <= 1.5 * exact
    assert ours > dp_accounting.get_epsilon_gaussian(z / math.sqrt(k), DELTA)


def test_local_epsilon_edges():
    assert local_epsilon(1.0, 0, DELTA) == 0.0
    assert local_epsilon(0.0, 0, DELTA) == 0.0
    assert local_epsilon(0.0, 3, DELTA) == math.inf
    assert local_epsilon(1.0, 2, DELTA) < local_epsilon(1.0, 3, DELTA)


# ----------------------------------------------------------------------------- resume
@pytest.mark.parametrize("schedule,method", [(POISSON, "rdp"), (POISSON, "pld"), (WOR, "rdp")])
def test_state_dict_resumes_to_the_same_bits(schedule, method):
    whole = Accountant(schedule, 1.2, DELTA, method)
    expected = [whole.step() for _ in range(10)]
    first = Accountant(schedule, 1.2, DELTA, method)
    got = [first.step() for _ in range(6)]
    state = json.loads(json.dumps(first.state_dict()))  # plain values only
    assert state["steps"] == 6
    second = Accountant(schedule, 1.2, DELTA, method)
    second.load_state_dict(state)
    assert second.steps == 6 and second.epsilon() == expected[5]
    got += [second.step() for _ in range(4)]
    assert got == expected


def test_a_state_of_another_configuration_is_refused():
    state = Accountant(POISSON, 1.2, DELTA).state_dict()
    with pytest.raises(ValueError) as err:
        Accountant(POISSON, 1.3, DELTA).load_state_dict(state)
    assert "noise_multiplier" in one_line(err)


# ----------------------------------------------------------------------------- cost per round
@pytest.mark.parametrize("schedule", [WOR, POISSON], ids=["without_replacement", "poisson"])
def test_rdp_step_costs_under_5ms_per_round(schedule):
    acc = Accountant(schedule, 1.17, DELTA)  # a z no other test caches: the curve is timed too
    start = time.perf_counter()
    for _ in range(1000):
        acc.step()
    mean = (time.perf_counter() - start) / 1000
    assert acc.steps == 1000
    assert mean < 5e-3, f"rdp: {mean * 1e3:.2f} ms per step"


def test_pld_step_cost_per_round():
    acc = Accountant(POISSON, 1.17, DELTA, "pld")
    start = time.perf_counter()
    for _ in range(300):
        acc.step()
    mean = (time.perf_counter() - start) / 300
    print(f"pld: {mean * 1e3:.2f} ms per step over 300 rounds")
    assert mean < 50e-3, f"pld: {mean * 1e3:.2f} ms per step"
