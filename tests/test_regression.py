"""No regressions from the method-interface change (issue 8): every reference run ends where it
ended before, at a tolerance that catches a changed algorithm but forgives last-bit differences
between CPU models. Goldens: ``tests/goldens/regression.json`` (``tests/regression.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.regression import CASES, GOLDEN, case_config, comparable, summarise

pytestmark = pytest.mark.slow
GOLDENS = json.loads(GOLDEN.read_text())
RTOL, ATOL = 1e-4, 1e-5


#: the case that goes through ``raysim.run`` on Ray; the others run their coordinator core in
#: this process (the same computation, without a Ray start-up per case; the equality of the two
#: paths is tested in test_interface.py and test_runtime.py)
ON_RAY = "quickstart"


def finished(name: str, request) -> tuple[dict, np.ndarray]:
    cfg = case_config(name)
    if name == ON_RAY:
        import raysim

        request.getfixturevalue("ray_cluster")
        res = raysim.run(cfg)
        return res.metrics, res.weights
    from raysim.actors.local import local_core

    core = local_core(cfg, evaluate=True)
    while not core.done:
        core.step()
    return core.final_metrics(), core.strategy.weights


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_run_is_unchanged(name, request):
    cfg = case_config(name)
    metrics, weights = finished(name, request)
    want = GOLDENS[name]
    got = comparable(metrics)
    # metrics added since the goldens (e.g. the per-client spread) are allowed; none may go
    assert not set(want["metrics"]) - set(got), sorted(set(want["metrics"]) - set(got))
    for key, value in want["metrics"].items():
        assert got[key] == pytest.approx(value, rel=RTOL, abs=ATOL, nan_ok=True), key
    tensors = summarise(cfg, weights)
    assert sorted(tensors) == sorted(want["tensors"])
    for tensor, (total, norm) in want["tensors"].items():
        np.testing.assert_allclose(
            tensors[tensor], [total, norm], rtol=RTOL, atol=ATOL, err_msg=tensor
        )
