"""Per-client input shifts (``data.shift``; FedOT spec §6.2, §9.1; invariant 12 of §8.2)."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.actors.local import local_core
from raysim.config import load_config
from raysim.data.federated import DataConfig, build_federated_dataset
from raysim.data.shifts import ClientShifts, ShiftConfig


def dataset(shift: dict, n: int = 10, seed: int = 0):
    cfg = DataConfig(
        name="digits",
        digits={"split": "fedot", "train_size": 20 * n},
        partition={"kind": "contiguous"},
        shift=shift,
    )
    return build_federated_dataset(cfg, n, seed)


def test_i12_affine_parameters_have_the_papers_laws():
    shifts = ClientShifts(ShiftConfig(kind="affine", sigma=2.0), 0, np.zeros((1, 64)))
    draws = [shifts.params(j, 64) for j in range(300)]
    s = np.stack([d["s"] for d in draws])
    z = np.stack([d["z"] for d in draws])
    assert s.min() >= 0.5 and s.max() <= 1.5
    assert abs(s.mean() - 1.0) < 0.01
    assert abs(z.mean()) < 0.02
    assert z.var() == pytest.approx(2.0, rel=0.03)  # σ is the variance (§8.2 item 12)


def test_i12_colour_backgrounds_are_exactly_a_and_foregrounds_x_times_b():
    ds = dataset({"kind": "colour"})
    raw = dataset({"kind": "none"})
    for j in (0, 7):
        p = ds.shifts.params(j, 64)
        x, shifted = raw.client_data(j)[0], ds.client_data(j)[0]
        assert shifted.shape == (20, 64, 3)
        background = x <= 1e-4
        assert background.any() and (~background).any()
        assert np.array_equal(
            shifted[background],
            np.broadcast_to(p["a"].astype(np.float32), (int(background.sum()), 3)),
        )
        expected = (x[~background][:, None].astype(np.float64) * p["b"]).astype(np.float32)
        assert np.array_equal(shifted[~background], expected)


def test_i12_a_clients_train_and_test_views_are_one_transform_reproducible_from_the_seed():
    ds, again, other = (
        dataset({"kind": "affine"}),
        dataset({"kind": "affine"}),
        dataset({"kind": "affine"}, seed=1),
    )
    raw = dataset({"kind": "none"})
    for j in (0, 3, 9):
        p = ds.shifts.params(j, 64)
        x = raw.client_data(j)[0]
        expected = (x.astype(np.float64) * p["s"] + p["z"]).astype(np.float32)
        assert np.array_equal(ds.client_data(j)[0], expected)
        expected_test = (raw.x_test.astype(np.float64) * p["s"] + p["z"]).astype(np.float32)
        assert np.array_equal(ds.shifts.test_view(j), expected_test)
        assert np.array_equal(again.shifts.test_view(j), ds.shifts.test_view(j))
    assert np.array_equal(ds.x_test, raw.x_test)  # the reference view: unshifted
    assert not np.array_equal(other.x_train, ds.x_train)  # another seed, other shifts


def test_code_full_mode_is_the_notebooks_quantised_full_matrix_shift():
    ds = dataset({"kind": "affine", "affine_mode": "code_full"})
    x = ds.client_data(2)[0].astype(np.float64)
    steps = x * 127.5 + 127.5
    assert np.allclose(steps, np.round(steps), atol=1e-3)  # on the notebook's integer grid
    assert x.std() > 3  # z ~ N(0, 25 I)


def test_bad_shift_settings_are_refused_in_one_line():
    from raysim.config import ConfigError

    with pytest.raises(ConfigError, match="shift"):
        load_config({"data": {"name": "bbc_news", "shift": {"kind": "affine"}}})
    with pytest.raises(ConfigError, match="scale"):
        load_config({"data": {"shift": {"kind": "affine", "scale": [1.5, 0.5]}}})


def test_any_method_is_scored_per_client_on_its_own_view():
    """FedAvg on shifted digits: every client is evaluated (mean, std, min over clients) on the
    test set through its own shift, and the global model on the reference view."""
    cfg = load_config(
        {
            "rounds": 2,
            "clients": {"num": 5, "per_round": 5},
            "data": {
                "name": "digits",
                "digits": {"split": "fedot", "train_size": 100},
                "partition": {"kind": "contiguous"},
                "shift": {"kind": "affine"},
            },
            "model": {"name": "mlp", "hidden": [16]},
            "eval": {"every": 2},
            "tracking": {"enabled": False},
        }
    )
    core = local_core(cfg, evaluate=True)
    core.step()
    m = core.step()
    assert m["clients_evaluated"] == 5
    assert {"accuracy", "accuracy_std", "accuracy_min", "accuracy_global"} <= set(m)
    assert m["accuracy_std"] > 0  # different views, different scores


def test_a_one_channel_image_becomes_a_channels_first_colour_image():
    x = np.zeros((2, 1, 3, 3), np.float32)
    x[:, 0, 1, 1] = 0.5
    shifts = ClientShifts(ShiftConfig(kind="colour"), 0, x)
    out, p = shifts.apply(4, x), shifts.params(4, 9)
    assert out.shape == (2, 3, 3, 3)
    assert np.array_equal(out[0, :, 0, 0], p["a"].astype(np.float32))
    assert np.array_equal(out[1, :, 1, 1], (0.5 * p["b"]).astype(np.float32))
    assert shifts.reference(x).shape == (2, 3, 3, 3)
