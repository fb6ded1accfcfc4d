"""Feddle on a model with BatchNorm and dropout (Feddle spec §3.1 A14, §3.5, §3.7, I-12), in
process: the ``cnn`` model's ``batch_norm`` and ``dropout`` switches build it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import raysim.algorithms.feddle.method as feddle
from raysim.actors.local import local_core
from raysim.models.layout import BUFFERS, SHARED
from tests.test_feddle import SHAPES
from tests.test_feddle_baselines import cfg_for

#: Conv → BatchNorm → ReLU → pool → FC → ReLU → Dropout(0.5) → FC: 4 BN channels, 9 buffer values
BN_CNN = {"name": "cnn", "channels": [4], "hidden": [16], "batch_norm": True, "dropout": 0.5}
DELAYS = {"kind": "half_normal", "sigma": 1.5}


def bn_cfg(algorithm: dict, rounds: int = 4):
    return cfg_for(
        {"server_epochs": 1, "server_lr": 0.05, "fallback_lr": 0.5, **algorithm},
        rounds=rounds,
        id_size=32,
        ood=[SHAPES] if algorithm["name"] == "feddle_ood" else (),
        model=BN_CNN,
        delays=DELAYS,
    )


def anchor_step(strategy, round_index: int, column: str) -> np.ndarray:
    """``Σ_m x_m ā_m`` for this round's ``column`` of the coefficient table (ĉ or c')."""
    rows = [r for r in strategy.coefficients if r["round"] == round_index]
    anchors, _ = strategy.atlas.normalized(strategy.params.normalize)  # scores only changed
    assert [r["anchor"] for r in rows] == [s.seq for s in strategy.atlas.slots]
    return np.array([r[column] for r in rows]) @ anchors.astype(np.float64)


def test_bn_buffers_stay_out_of_the_anchors_and_follow_the_fallback_mean():
    """§3.1, A14: anchors hold the trainable coordinates only and move them by Eq. 7; the buffers
    move by ``b^{k+1} = b^k + mean_{j∈R_k} Δb_j`` (unchanged when nothing arrived), neither by
    the searched ĉ nor η_fb, nor as FedAvg of the arriving models' buffers."""
    core = local_core(bn_cfg({"name": "feddle"}))
    strategy = core.strategy
    shared, buffers = strategy.ctx.layout.mask(SHARED), strategy.ctx.layout.mask(BUFFERS)
    assert buffers.sum() == 9 and not (shared & buffers).any()
    arrivals = []
    on_arrival = strategy.on_arrival

    def spy(update):
        arrivals.append(update)
        return on_arrival(update)

    strategy.on_arrival = spy
    moved = fedavg_differs = 0
    while not core.done:
        k, before = core.round, strategy.weights.astype(np.float64)
        arrivals.clear()
        core.step()
        after = strategy.weights.astype(np.float64)
        assert {s.delta.size for s in strategy.atlas.slots} == {int(shared.sum())}
        if arrivals:
            mean = np.mean([u.delta[buffers] for u in arrivals], axis=0, dtype=np.float64)
            np.testing.assert_allclose(after[buffers], before[buffers] + mean, rtol=0, atol=1e-5)
            moved += bool(np.abs(mean).max() > 1e-3)
            n = np.array([u.num_samples for u in arrivals], dtype=np.float64)
            local = np.stack([u.local_weights[buffers] for u in arrivals])
            avg = (n / n.sum()) @ local  # what bn_buffers=fedavg_models would give
            fedavg_differs += bool(np.abs(avg - after[buffers]).max() > 1e-3)
        else:
            np.testing.assert_array_equal(after[buffers], before[buffers])
        if len(strategy.atlas):  # Eq. 7 on the trainable coordinates
            step = anchor_step(strategy, k, "coefficient")
            np.testing.assert_allclose(after[shared] - before[shared], step, rtol=0, atol=1e-5)
    assert moved >= 2 and fedavg_differs >= 1  # the rule is observable, and not FedAvg's


@pytest.mark.parametrize("name", ["feddle", "feddle_ood"])
def test_the_search_and_the_probe_fit_run_the_model_in_eval_mode(name, monkeypatch):
    """§3.7 (and §3.5 for the probe): every forward pass of the server's search, its diagnostics
    and the probe fitting sees BatchNorm and Dropout in eval(); BN's running statistics stay at
    ωᵏ's (batch statistics would move them)."""
    phase, passes = ["other"], []
    search, fit_probe, run_search = feddle.search, feddle.fit_probe, feddle.Feddle._search

    def in_phase(label, fn):
        def wrapped(*args, **kwargs):
            phase[0] = label
            try:
                return fn(*args, **kwargs)
            finally:
                phase[0] = "other"

        return wrapped

    def spy_search(self, round_index, *args):
        handle = self.ctx.model()[0]
        kinds = (torch.nn.BatchNorm2d, torch.nn.Dropout)
        layers = [m for m in handle.module.modules() if isinstance(m, kinds)]
        assert len(layers) == 2
        hook = handle.module.register_forward_pre_hook(
            lambda *_: passes.append((phase[0], [m.training for m in layers]))
        )
        try:
            out = run_search(self, round_index, *args)
        finally:
            hook.remove()
        bn = layers[0]
        layout = self.ctx.layout
        for buf in ("running_mean", "running_var"):
            (spec,) = layout.select(BUFFERS, rf"\.{buf}$")
            np.testing.assert_array_equal(getattr(bn, buf).cpu().numpy(), self.weights[spec.slice])
        return out

    monkeypatch.setattr(feddle, "search", in_phase("search", search))
    monkeypatch.setattr(feddle, "fit_probe", in_phase("probe", fit_probe))
    monkeypatch.setattr(feddle.Feddle, "_search", spy_search)
    core = local_core(bn_cfg({"name": name, "ood_samples_per_round": 64}, rounds=3))
    while not core.done:
        core.step()
    seen = {p for p, _ in passes}
    assert {"search", "other"} | ({"probe"} if name == "feddle_ood" else set()) <= seen
    in_train = [(p, flags) for p, flags in passes if any(flags)]  # (BN, Dropout).training
    assert not in_train, in_train[:3]


def test_ood_probe_is_fitted_at_the_fallback_start_not_at_the_global_model(monkeypatch):
    """I-12 / Eq. 9 in a run: θ* is fitted with the model at ``ωᵏ + Σ c'_m ā_m`` (the search's
    start), not at ωᵏ; c' ≠ 0 in rounds with arrivals, so the two differ."""
    fit_probe, at_fit = feddle.fit_probe, []

    def spy(probe, module, *args, **kwargs):
        at_fit.append(torch.nn.utils.parameters_to_vector(module.parameters()).detach().numpy())
        return fit_probe(probe, module, *args, **kwargs)

    monkeypatch.setattr(feddle, "fit_probe", spy)
    core = local_core(bn_cfg({"name": "feddle_ood", "ood_samples_per_round": 64}))
    strategy = core.strategy
    shared = strategy.ctx.layout.mask(SHARED)
    apart = 0
    while not core.done:
        k, before = core.round, strategy.weights[shared].astype(np.float64)
        at_fit.clear()
        core.step()
        if not len(strategy.atlas):
            assert not at_fit
            continue
        (fitted_at,) = at_fit
        start = before + anchor_step(strategy, k, "fallback")
        np.testing.assert_allclose(fitted_at, start, rtol=0, atol=1e-5)
        apart += bool(np.abs(start - before).max() > 1e-3)
    assert apart >= 2  # c' moved the start away from ωᵏ: the test can tell them apart
