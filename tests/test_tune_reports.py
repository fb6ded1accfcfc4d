"""How a Tune trial hands its reports to Tune's controller (``raysim.sweeps.ahead``,
``RunTrial.train_buffered``): rounds run ahead while the controller reads, but never past a
round on which the scheduler may stop the trial; and ``decision_rounds`` holds every round on
which Ray's ASHA acts."""

from __future__ import annotations

import threading
import time

import pytest

from raysim.sweeps.ahead import REPORTS_AT_ONCE, ReportsAhead
from raysim.sweeps.space import TuneSection
from raysim.sweeps.tuner import decision_rounds


class Rounds:
    """A trial's reports, one per call, counted; ``fail_at`` raises instead."""

    def __init__(self, last: int = 10, fail_at: int | None = None) -> None:
        self.made, self.last, self.fail_at = 0, last, fail_at
        self.lock = threading.Lock()

    def __call__(self) -> dict:
        with self.lock:
            self.made += 1
            if self.made == self.fail_at:
                raise RuntimeError(f"round {self.made} failed")
            return {"round": self.made, "done": self.made == self.last}


def settle(rounds: Rounds, until: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while rounds.made < until and time.monotonic() < deadline:
        time.sleep(0.005)


def test_rounds_run_ahead_but_wait_at_a_deciding_round_for_the_next_call():
    rounds = Rounds(last=10)
    ahead = ReportsAhead(rounds, lambda r: r["round"] in (3, 6))
    settle(rounds, 3)
    time.sleep(0.2)  # time enough to run past round 3, were it allowed
    assert rounds.made == 3
    assert [r["round"] for r in ahead.take()] == [1, 2, 3]  # the deciding report comes last
    time.sleep(0.1)
    assert rounds.made == 3  # the controller has not answered yet: its next call does
    reports = ahead.take()  # waits for round 4, and takes what came after it
    while reports[-1]["round"] < 6:
        reports += ahead.take()
    assert [r["round"] for r in reports] == [4, 5, 6]
    time.sleep(0.1)
    assert rounds.made == 6
    reports = []
    while not (reports and reports[-1]["done"]):
        reports += ahead.take()
    assert [r["round"] for r in reports] == [7, 8, 9, 10]
    ahead.stop()


def test_a_trial_stopped_at_a_deciding_round_runs_no_round_past_it():
    rounds = Rounds(last=10)
    ahead = ReportsAhead(rounds, lambda r: r["round"] == 2)
    settle(rounds, 2)
    assert [r["round"] for r in ahead.take()] == [1, 2]
    ahead.stop()  # what the scheduler's STOP leads to (RunTrial.cleanup)
    assert rounds.made == 2


def test_a_first_report_that_decides_holds_the_thread_until_the_next_call():
    rounds = Rounds(last=5)
    ahead = ReportsAhead(rounds, lambda r: False, waiting=True)
    time.sleep(0.2)
    assert rounds.made == 0
    assert [r["round"] for r in ahead.take()][0] == 1
    ahead.stop()


def test_an_error_comes_after_the_reports_made_before_it():
    rounds = Rounds(last=10, fail_at=4)
    ahead = ReportsAhead(rounds, lambda r: False)
    settle(rounds, 4)
    time.sleep(0.05)
    assert [r["round"] for r in ahead.take()] == [1, 2, 3]
    with pytest.raises(RuntimeError, match="round 4 failed"):
        ahead.take()
    ahead.stop()


def test_one_call_hands_on_at_most_reports_at_once():
    rounds = Rounds(last=REPORTS_AT_ONCE + 5)
    ahead = ReportsAhead(rounds, lambda r: False)
    settle(rounds, REPORTS_AT_ONCE + 5)
    time.sleep(0.05)
    assert len(ahead.take()) == REPORTS_AT_ONCE
    assert [r["round"] for r in ahead.take()] == list(range(REPORTS_AT_ONCE + 1, rounds.last + 1))
    ahead.stop()


@pytest.mark.parametrize(
    ("asha", "rounds"),
    [
        ({"grace_period": 1, "reduction_factor": 2}, 2),
        ({"grace_period": 2, "reduction_factor": 3}, 20),
        ({"grace_period": 3, "reduction_factor": 2, "max_t": 24}, 30),
        ({"grace_period": 1, "reduction_factor": 4, "max_t": 63}, 100),
        ({"grace_period": 5, "reduction_factor": 2}, 5),
    ],
)
def test_decision_rounds_hold_every_round_on_which_ashas_rungs_act(asha, rounds):
    from raysim.sweeps.tuner import _scheduler

    section = TuneSection.model_validate(
        {"space": {"local.lr": {"grid": [0.1]}}, "scheduler": "asha", "asha": asha}
    )
    scheduler = _scheduler(section, rounds)
    rungs = {milestone for bracket in scheduler._brackets for milestone, _ in bracket._rungs}
    decisions = decision_rounds(section, rounds)
    assert rungs <= set(decisions), (rungs, decisions)
    assert scheduler._max_t in decisions  # where ASHA stops every trial
    fifo = TuneSection.model_validate({"space": {"local.lr": {"grid": [0.1]}}})
    assert decision_rounds(fifo, rounds) == ()
