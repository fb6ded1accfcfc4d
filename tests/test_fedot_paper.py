"""FedOT's paper-scale configs (FedOT spec §6–7): every table cell validates, and each config's data
loads through Hugging Face ``datasets`` (a small local copy in the presets' format) and trains a
round with the paper's networks."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from raysim.actors.local import local_core
from raysim.config import apply_overrides, load_config
from tests.conftest import EXAMPLES

PAPER = EXAMPLES / "fedot" / "paper"
CONFIGS = sorted(PAPER.glob("*-alexnet.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_row_column_and_tau_of_tables_1_and_2_validates(path):
    table = yaml.safe_load((PAPER / "methods.yaml").read_text())
    raw = yaml.safe_load(path.read_text())
    for model in ("alexnet", "mini_inception"):
        for cell in table["cells"].values():
            for tau in table["taus"].values():
                for algo in table["methods"].values():
                    given = {**raw, "model": {"name": model}}
                    if algo:
                        given["algorithm"] = algo
                    over = [f"{k}={v}" for k, v in {**cell, **tau}.items()]
                    cfg = load_config(apply_overrides(given, over))
                    assert cfg.clients.num == 100 and cfg.clients.per_round == 100
    cfg = load_config(raw)
    assert cfg.data.hf_image.path in ("ylecun/mnist", "uoft-cs/cifar10")  # a hub id
    assert load_config(cfg.to_dict()) == cfg


def fake_hub_copy(tmp_path, channels: int, side: int):
    """A DatasetDict saved to disk in the presets' columns (``image``/``img``, ``label``)."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    column = "image" if channels == 1 else "img"

    def split(n: int) -> datasets.Dataset:
        pixels = (rng.random((n, side, side, channels)) > 0.6) * rng.integers(0, 255, (n, 1, 1, 1))
        mode = "L" if channels == 1 else "RGB"
        images = [Image.fromarray(p.squeeze().astype(np.uint8), mode) for p in pixels]
        return datasets.Dataset.from_dict({column: images, "label": rng.integers(0, 10, n)})

    path = tmp_path / f"hub-{channels}"
    datasets.DatasetDict({"train": split(60), "test": split(20)}).save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("name", ["mnist-alexnet", "cifar10-alexnet", "cmnist-alexnet"])
def test_each_configs_data_loads_through_datasets_and_trains_a_round(name, tmp_path):
    raw = yaml.safe_load((PAPER / f"{name}.yaml").read_text())
    cifar = name.startswith("cifar")
    local = fake_hub_copy(tmp_path, 3 if cifar else 1, 32 if cifar else 28)
    cfg = load_config(
        raw,
        [
            f"data.hf_image.path={local}",
            "data.hf_image.load_from_disk=true",
            "data.hf_image.train_size=40",
            "clients.num=4",
            "clients.per_round=4",
            "rounds=1",
            "algorithm.k_max=2",
            "eval.every=1",
            "workers.num_gpus=0",
            "tracking.enabled=false",
        ],
    )
    core = local_core(cfg, evaluate=True)
    ds = core.executor.runner.dataset
    shape = (3, 32, 32) if cifar else ((3, 28, 28) if name.startswith("cmnist") else (1, 28, 28))
    assert ds.feature_shape == shape
    assert ds.client_sizes().tolist() == [10, 10, 10, 10]
    assert ds.shifts.test_view(2).shape == (20, *shape)
    m = core.step()
    assert np.isfinite(m["train_loss"]) and m["clients_evaluated"] == 4


@pytest.mark.parametrize(
    "name, shape, millions",
    [
        ("alexnet", (3, 32, 32), 5.52),
        ("alexnet", (1, 28, 28), 4.23),
        ("mini_inception", (3, 32, 32), 1.86),
        ("mini_inception", (1, 28, 28), 1.81),
    ],
)
def test_the_papers_networks_have_the_specs_sizes(name, shape, millions):
    """FedOT spec §6.3: AlexNet 5.52 M (CIFAR) / 4.23 M (MNIST), mini-Inception 1.86 M / 1.81 M."""
    import torch

    from raysim.models import DataSpec, ModelConfig, build_model

    model = build_model(ModelConfig(name=name), DataSpec("dense", shape, 10))
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, abs=0.006)
    assert model(torch.rand(2, *shape)).shape == (2, 10)
