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


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_run_is_unchanged(name, ray_cluster):
    import raysim

    cfg = case_config(name)
    res = raysim.run(cfg)
    want = GOLDENS[name]
    got = comparable(res.metrics)
    # metrics added since the goldens (e.g. the per-client spread) are allowed; none may go
    assert not set(want["metrics"]) - set(got), sorted(set(want["metrics"]) - set(got))
    for key, value in want["metrics"].items():
        assert got[key] == pytest.approx(value, rel=RTOL, abs=ATOL, nan_ok=True), key
    tensors = summarise(cfg, res.weights)
    assert sorted(tensors) == sorted(want["tensors"])
    for tensor, (total, norm) in want["tensors"].items():
        np.testing.assert_allclose(
            tensors[tensor], [total, norm], rtol=RTOL, atol=ATOL, err_msg=tensor
        )
