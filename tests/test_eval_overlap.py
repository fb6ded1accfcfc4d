"""A round's evaluation left running while the next round is dispatched (``step(settle=False)``,
what ``Coordinator.advance`` does) changes nothing but when its metrics arrive."""

from __future__ import annotations

from raysim.actors.coordinator_core import TIMING_METRICS
from raysim.actors.local import local_core
from raysim.config import load_config
from tests.conftest import tiny


def run(settle: bool, **overrides):
    core = local_core(load_config(tiny(rounds=5, **overrides)), evaluate=True)
    seen = []
    while not core.done:
        metrics = core.step(settle)
        seen.append((metrics, "accuracy" in metrics))
    return core, seen


def test_unsettled_rounds_end_with_the_same_metrics_and_weights():
    """Every round's metrics, the evaluations and the weights are those of a settled run; an
    unsettled round lacks its evaluation when returned and has it (the same dict) after the
    next step; the last round is always settled."""
    settled, _ = run(True)
    core, seen = run(False)
    assert [has for _, has in seen] == [False] * 4 + [True]
    assert all("accuracy" in m for m, _ in seen)  # filled in later, in place
    strip = TIMING_METRICS
    assert [{k: v for k, v in h.items() if k not in strip} for h in core.history] == [
        {k: v for k, v in h.items() if k not in strip} for h in settled.history
    ]
    assert core.evaluations == settled.evaluations
    assert core.digest() == settled.digest()


def test_a_checkpoint_settles_the_round_first():
    """``state_dict`` (a checkpoint) waits for the evaluation, so a resumed run has it."""
    core = local_core(load_config(tiny(rounds=5)), evaluate=True)
    metrics = core.step(settle=False)
    assert "accuracy" not in metrics
    state = core.state_dict()
    assert "accuracy" in metrics and state["history"][0]["accuracy"] == metrics["accuracy"]
    assert len(state["evaluations"]) == 1


class Rounds:
    """A stand-in tracker: which rounds were logged, with which keys."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, bool]] = []

    def log_round(self, k: int, metrics: dict) -> None:
        self.logged.append((k, "accuracy" in metrics))


def test_each_round_is_logged_once_with_its_evaluation():
    for settle in (True, False):
        core = local_core(load_config(tiny(rounds=4, eval={"every": 2})), evaluate=True)
        core.tracker = Rounds()
        while not core.done:
            core.step(settle)
        assert core.tracker.logged == [(1, False), (2, True), (3, False), (4, True)], settle
