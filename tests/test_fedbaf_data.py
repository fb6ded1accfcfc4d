"""The vision proxy of FedBaF spec §8.1 and the partitions and logit masking of §4.2 and §4.5."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from raysim.actors.local import local_core
from raysim.algorithms.fedbaf.matching import match_layers
from raysim.config import load_config
from raysim.data import build_federated_dataset
from raysim.data.digits_split import digits_pools, flipped, twenty_classes
from raysim.data.federated import DataConfig
from raysim.data.partition import class_subset
from raysim.models.pretrain_digits import DigitsPretrainConfig, pretrain_digits
from raysim.models.registry import DataSpec, ModelConfig, build_handle
from raysim.training.loop import LocalTrainingConfig, local_accuracy, train_local
from raysim.training.tasks import ClassificationTask
from tests.conftest import tiny


def test_the_pools_are_disjoint_stratified_and_fixed_whatever_the_run_seed():
    pools = digits_pools(0)
    assert [len(pools[k][1]) for k in ("foundation", "federated", "test")] == [600, 900, 297]
    rows = {k: {v.tobytes() for v in x} for k, (x, _) in pools.items()}
    assert not rows["foundation"] & rows["federated"] and not rows["federated"] & rows["test"]
    for _, y in pools.values():
        counts = np.bincount(y, minlength=10)
        assert counts.max() - counts.min() <= 0.1 * counts.mean() + 2
    a = build_federated_dataset(DataConfig(digits={"split": "fedbaf"}), 10, seed=1)
    b = build_federated_dataset(DataConfig(digits={"split": "fedbaf"}), 10, seed=2)
    assert np.array_equal(a.x_test, b.x_test) and len(a.y_train) == 900
    noisy = build_federated_dataset(DataConfig(digits={"split": "fedbaf", "pixel_noise": 2}), 10, 1)
    assert np.array_equal(noisy.x_test, a.x_test) and not np.array_equal(noisy.x_train, a.x_train)
    with pytest.raises(
        ValueError, match="data.digits applies only to name='digits', not to name='mnist1d'"
    ):
        DataConfig(name="mnist1d", digits={"split": "fedbaf"})


def test_class_subsets_are_distinct_equal_and_cover_every_class():
    labels = np.repeat(np.arange(10), 90)
    parts = class_subset(labels, 10, 2, np.random.default_rng(0))
    held = [np.unique(labels[p]) for p in parts]
    assert all(len(h) == 2 for h in held)
    assert set(np.concatenate(held)) == set(range(10))
    for p in parts:
        counts = np.bincount(labels[p])
        assert len(set(counts[counts > 0])) == 1  # the same number of each held class
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat))  # no row twice
    balanced = class_subset(labels, 10, 10, np.random.default_rng(0))  # iid_balanced
    assert all(np.array_equal(np.bincount(labels[p]), [9] * 10) for p in balanced)
    with pytest.raises(ValueError, match="exceeds"):
        class_subset(labels, 10, 11, np.random.default_rng(0))


def test_absent_logits_change_the_loss_only_for_a_client_missing_classes():
    torch.manual_seed(0)
    x = torch.randn(32, 64)

    def trained(y, mode):
        torch.manual_seed(1)
        model = torch.nn.Linear(64, 10)
        cfg = LocalTrainingConfig(epochs=1, batch_size=8, lr=0.1, absent_logits=mode)
        gen = torch.Generator().manual_seed(0)
        train_local(model, list(model.parameters()), ClassificationTask(), (x, y), cfg, gen)
        return model.weight.detach().clone()

    two = torch.arange(32) % 2
    every = torch.arange(32) % 10
    assert not torch.equal(trained(two, "keep"), trained(two, "zero"))
    assert not torch.equal(trained(two, "zero"), trained(two, "neg_inf"))
    assert torch.equal(trained(every, "keep"), trained(every, "zero"))  # nothing is absent


def test_local_accuracy_scores_only_the_clients_classes_with_the_mask():
    model = torch.nn.Linear(2, 3, bias=False)
    model.weight.data = torch.tensor([[1.0, 0.0], [0.0, 1.0], [10.0, 10.0]])
    x = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 2])
    # class 2 is absent: its huge logit would win everything unmasked
    assert local_accuracy(model, torch.tensor([0, 1]), (x, y), "keep") == 0.0
    assert local_accuracy(model, torch.tensor([0, 1]), (x, y), "neg_inf") == 1.0


def test_a_non_iid_run_logs_the_local_accuracy_of_its_clients():
    cfg = load_config(
        tiny(
            rounds=2,
            clients={"num": 10, "fraction": 0.5},
            data={
                "name": "digits",
                "digits": {"split": "fedbaf"},
                "partition": {"kind": "class_subset", "classes_per_client": 2},
            },
            local={"epochs": 1, "batch_size": 16, "lr": 0.1, "absent_logits": "zero"},
            eval={"every": 1, "local_accuracy": True},
        )
    )
    core = local_core(cfg, evaluate=True)
    h = [core.step() for _ in range(2)][-1]
    assert h["client_local_accuracy"] > h["accuracy"]  # two classes are easier than ten


def test_the_foundation_matches_the_fl_body_and_not_its_head(tmp_path):
    meta = pretrain_digits(DigitsPretrainConfig(samples=100, epochs=10), tmp_path)
    assert meta["heldout_accuracy"] > 0.3  # 20 classes: chance is 0.05
    x, y = twenty_classes(*digits_pools(0)["test"])
    assert len(y) == 594 and set(np.unique(y)) == set(range(20))
    assert np.array_equal(flipped(flipped(x[:5])), x[:5])
    weights = load_file(str(tmp_path / "model.safetensors"))
    fl = build_handle(ModelConfig(name="mlp", hidden=[128, 128]), DataSpec("dense", (64,), 10))
    matches, unmatched = match_layers(
        fl.layout(), {k: tuple(v.shape) for k, v in weights.items()}, "exact", []
    )
    head = [n for n, _ in fl.layout().shapes()][-2:]
    assert sorted(unmatched) == sorted(head)
    assert len(matches) == 4  # two hidden layers: weights and biases


def test_raysim_pretrain_digits_from_the_command_line(tmp_path, capsys):
    from raysim import cli

    out = tmp_path / "f"
    rc = cli.main(["pretrain", "digits", "--out", str(out), "--samples", "100", "--epochs", "2"])
    assert rc == 0 and (out / "model.safetensors").is_file()
    assert "held-out accuracy" in capsys.readouterr().out
