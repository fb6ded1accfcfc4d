"""Adversarial clients of FedBaF spec §4.4 and §6.3 as ``hooks.clients`` behaviours.

A fixed malicious set of ζ·K clients, label shuffling with λ epoch scaling, a pixel-trigger
backdoor with its attack success rate, and the collusion observer's records.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from raysim.actors.local import local_core
from raysim.algorithms.base import ClientContext
from raysim.algorithms.fedbaf.adversaries import BackdoorParams, scaled_epochs, stamp
from raysim.algorithms.hooks import chosen_clients
from raysim.algorithms.registry import BEHAVIOURS
from raysim.config import load_config
from raysim.training.loop import LocalTrainingConfig
from raysim.training.tasks import ClassificationTask
from tests.conftest import tiny


def run(cfg, rounds=None, seen=None):
    core = local_core(cfg, evaluate=True)
    if seen is not None:
        orig = core.strategy.on_arrival
        core.strategy.on_arrival = lambda u: (seen.append(u), orig(u))[1]
    history = []
    while not core.done and (rounds is None or core.round < rounds):
        history.append(core.step())
    return core, history


def ctx_for(client: int, y: torch.Tensor, dispatch_round: int = 0, seed: int = 7) -> ClientContext:
    x = torch.zeros(len(y), 64)
    return ClientContext(
        None,
        ClassificationTask(),
        (x, y),
        LocalTrainingConfig(),
        None,
        client,
        dispatch_round,
        seed=seed,
    )


def test_the_malicious_set_is_fixed_by_the_seed_and_nested_across_fractions():
    k = 20
    small, large = chosen_clients(0.1, 3, k), chosen_clients(0.5, 3, k)
    assert len(small) == 2 and len(large) == 10
    assert set(small) <= set(large)
    assert chosen_clients(0.5, 3, k) == large and chosen_clients(0.5, 4, k) != large
    b = BEHAVIOURS.get("label_shuffle").build({"fraction": 0.5})
    b.setup(3, k)
    assert [j for j in range(k) if b.applies(j, 0)] == large
    with pytest.raises(ValueError, match="clients or fraction"):
        load_config(
            tiny(hooks={"clients": [{"name": "label_shuffle", "clients": [1], "fraction": 0.1}]})
        )


def test_label_shuffle_uses_one_permutation_per_client_unless_asked_per_visit():
    y = torch.arange(40) % 10
    fixed = BEHAVIOURS.get("label_shuffle").build({})
    fixed.setup(3, 20)
    a = fixed.on_data(ctx_for(1, y, 0, seed=11), (None, y))[1]
    b = fixed.on_data(ctx_for(1, y, 5, seed=99), (None, y))[1]
    other = fixed.on_data(ctx_for(2, y, 0, seed=11), (None, y))[1]
    assert torch.equal(a, b) and not torch.equal(a, y) and not torch.equal(a, other)
    assert torch.equal(torch.sort(a).values, torch.sort(y).values)  # the label marginal is kept
    visit = BEHAVIOURS.get("label_shuffle").build({"permutation": "per_visit"})
    visit.setup(3, 20)
    c = visit.on_data(ctx_for(1, y, 0, seed=11), (None, y))[1]
    d = visit.on_data(ctx_for(1, y, 5, seed=99), (None, y))[1]
    assert not torch.equal(c, d)


def test_epoch_scaling_multiplies_for_vision_and_divides_into_steps_for_language():
    y = torch.arange(90) % 10
    cfg = LocalTrainingConfig(epochs=2, batch_size=16)
    vision = BEHAVIOURS.get("label_shuffle").build({"epoch_scale": 5})
    assert vision.on_local(ctx_for(0, y), cfg).epochs == 10
    lm = BEHAVIOURS.get("label_shuffle").build({"epoch_scale": 5, "epoch_rule": "divide"})
    out = lm.on_local(ctx_for(0, y), cfg)  # E/λ = 0.4 epoch of 6 steps: ⌈2.4⌉ = 3 steps
    assert (out.epochs, out.max_steps) == (1, 3)
    assert scaled_epochs(cfg, 90, 3.0).max_steps is None


def test_attackers_train_their_scaled_steps_in_a_run_and_only_they_do():
    hooks = [{"name": "label_shuffle", "fraction": 0.5, "epoch_scale": 4, "epoch_rule": "divide"}]
    cfg = load_config(
        tiny(rounds=2, local={"epochs": 1, "batch_size": 8, "lr": 0.1}, hooks={"clients": hooks})
    )
    bad = set(chosen_clients(0.5, cfg.seed, cfg.clients.num))
    seen = []
    run(cfg, seen=seen)
    for u in seen:
        full = -(-u.num_samples // 8)
        expected = -(-full // 4) if u.client_id in bad else full
        assert u.metrics["local_steps"] == expected, u.client_id
    assert any(u.client_id in bad for u in seen) and any(u.client_id not in bad for u in seen)


def test_the_trigger_is_a_corner_patch_and_bad_shapes_are_refused():
    p = BackdoorParams(size=2, value=1.0)
    x = np.zeros((3, 64), np.float32)
    out = stamp(x, p).reshape(3, 8, 8)
    assert out[:, 6:, 6:].min() == 1.0 and out.sum() == 3 * 4 and x.sum() == 0
    with pytest.raises(ValueError, match="not 7x7"):
        stamp(np.zeros((1, 50), np.float32), BackdoorParams(image_shape=(7, 7)))


def test_a_boosted_backdoor_raises_the_attack_success_rate_it_logs():
    def scores(rounds_on):
        hooks = [
            {
                "name": "backdoor",
                "fraction": 0.2,
                "target": 0,
                "size": 3,
                "boost": 2.0,
                "rounds": rounds_on,
            }
        ]
        _, history = run(load_config(tiny(rounds=6, hooks={"clients": hooks})))
        return history[-1]["backdoor_accuracy"], history[-1]["accuracy"]

    clean_asr, clean_acc = scores([])  # the same triggered set; the attack never applies
    asr, acc = scores(None)
    assert asr > clean_asr + 0.3, (clean_asr, asr)
    assert acc > clean_acc - 0.1  # the backdoor rides along; the main task still learns


def test_observers_record_the_broadcast_and_the_update_the_server_got(tmp_path):
    hooks = [{"name": "observe", "dir": str(tmp_path / "obs")}]
    cfg = load_config(tiny(rounds=2, hooks={"clients": hooks}))
    seen = []
    run(cfg, seen=seen)
    files = sorted((tmp_path / "obs").glob("*.safetensors"))
    assert len(files) == len(seen) == 2 * cfg.clients.per_round
    for u in seen:
        rec = load_file(
            str(tmp_path / "obs" / f"r{u.dispatch_round:06d}_c{u.client_id:06d}.safetensors")
        )
        np.testing.assert_array_equal(rec["received"], u.base)
        np.testing.assert_array_equal(rec["delta"], u.delta)
