"""Image sets through Hugging Face ``datasets`` (Feddle spec §5.2), on image datasets the
tests write: a ``save_to_disk`` directory and an ``imagefolder`` of PNG files, read through the
presets."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image

from raysim.actors.local import local_core
from raysim.config import load_config
from raysim.data import DataConfig, build_federated_dataset
from raysim.data.federated import PARTITION_TAG
from raysim.data.partition import PartitionConfig, partition


def rgb(rng: np.random.Generator, n: int, side: int) -> list[Image.Image]:
    return [
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(n)
    ]


def save_cifar100_like(path, rng) -> dict:
    """Train/test splits with 10 fine classes in 5 superclasses (fine // 2), 3×8×8 images."""
    import datasets

    features = datasets.Features(
        {
            "img": datasets.Image(),
            "fine_label": datasets.ClassLabel(num_classes=10),
            "coarse_label": datasets.ClassLabel(num_classes=5),
        }
    )
    splits = {}
    for split, n in (("train", 200), ("test", 60)):
        fine = rng.integers(0, 10, n)
        splits[split] = datasets.Dataset.from_dict(
            {"img": rgb(rng, n, 8), "fine_label": fine, "coarse_label": fine // 2},
            features=features,
        )
    datasets.DatasetDict(splits).save_to_disk(str(path))
    return splits


def test_cifar100_superclasses_partitioned_over_fine_classes(tmp_path):
    rng = np.random.default_rng(0)
    source = save_cifar100_like(tmp_path / "c100", rng)
    cfg = DataConfig(
        name="hf_image",
        hf_image={
            "preset": "cifar100_superclass",
            "path": str(tmp_path / "c100"),
            "load_from_disk": True,
        },
        partition={"kind": "dirichlet", "alpha": 0.1},
        server={"id_size": 10},
    )
    ds = build_federated_dataset(cfg, num_clients=8, seed=3)
    assert ds.num_classes == 5 and ds.feature_shape == (3, 8, 8)
    train = source["train"]
    expected = np.stack(
        [np.asarray(im, np.float32).transpose(2, 0, 1) / 255 for im in train["img"]]
    )
    np.testing.assert_array_equal(ds.x_train, expected)  # pixels exact, channels first, [0, 1]
    np.testing.assert_array_equal(ds.y_train, train["coarse_label"])  # trained on superclasses
    assert len(ds.y_test) == 50 and len(ds.server_id[1]) == 10  # the server's 10 from test
    # the clients are the Dirichlet split of the *fine* labels (§5.2), not the coarse ones
    rng_p = np.random.default_rng([3, PARTITION_TAG])
    fine = np.asarray(train["fine_label"])
    parts = partition(PartitionConfig(kind="dirichlet", alpha=0.1), fine, 8, rng_p)
    for j, part in enumerate(parts):
        np.testing.assert_array_equal(ds.client_train_indices(j), part)


def write_femnist_like(root, rng) -> list[dict]:
    """An imagefolder of 28×28 grayscale PNGs with LEAF-like columns (writer, character)."""
    train = root / "train"
    train.mkdir(parents=True)
    rows = []
    for i in range(60):
        name = f"{i:03d}.png"
        pixels = rng.integers(0, 256, (28, 28), dtype=np.uint8)
        Image.fromarray(pixels, mode="L").save(train / name)
        rows.append(
            {"file_name": name, "character": int(rng.integers(0, 6)), "writer_id": f"w{i % 6}"}
        )
    with open(train / "metadata.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["file_name", "character", "writer_id"])
        writer.writeheader()
        writer.writerows(rows)
    return rows


def test_femnist_writers_become_clients_first_classes_only(tmp_path):
    rows = write_femnist_like(tmp_path / "femnist", np.random.default_rng(1))
    cfg = DataConfig(
        name="hf_image",
        hf_image={
            "preset": "femnist",
            "path": "imagefolder",
            "data_dir": str(tmp_path / "femnist"),
            "keep_labels": 3,
        },
        partition={"kind": "natural", "natural_clients": "sample"},
        test_fraction=0.25,
    )
    ds = build_federated_dataset(cfg, num_clients=4, seed=0)  # 4 of the 6 writers, at random
    kept = [r for r in rows if r["character"] < 3]
    assert ds.num_classes == 3 and ds.feature_shape == (3, 28, 28)  # grayscale → 3 channels
    assert set(ds.y_train.tolist()) <= {0, 1, 2}
    assert len(ds.y_train) + len(ds.y_test) == len(kept)
    assert np.array_equal(ds.x_train[:, 0], ds.x_train[:, 2])  # replicated channels
    # each client holds one writer's images: identical pixels identify the rows
    by_pixels = {
        np.asarray(Image.open(tmp_path / "femnist/train" / r["file_name"])).tobytes(): r
        for r in kept
    }
    writers = []
    for j in range(ds.num_clients):
        x, y = ds.client_data(j)
        owners = {
            by_pixels[(xi[0] * 255).round().astype(np.uint8).tobytes()]["writer_id"] for xi in x
        }
        assert len(owners) == 1
        writers += owners
    assert len(set(writers)) == 4


def test_celeba_smiling_is_a_binary_task(tmp_path):
    import datasets

    rng = np.random.default_rng(2)
    n = 40
    data = {
        "image": rgb(rng, n, 12),
        "celeb_id": rng.integers(0, 5, n),
        "Smiling": rng.integers(0, 2, n).astype(bool),
    }
    datasets.Dataset.from_dict(data).save_to_disk(str(tmp_path / "celeba"))
    cfg = DataConfig(
        name="hf_image",
        hf_image={
            "preset": "celeba",
            "path": str(tmp_path / "celeba"),
            "load_from_disk": True,
            "test_split": None,
            "size": 8,
        },
        partition={"kind": "natural"},
    )
    ds = build_federated_dataset(cfg, num_clients=5, seed=0)
    assert ds.num_classes == 2 and ds.feature_shape == (3, 8, 8)  # resized to 8×8
    everything = np.concatenate([ds.y_train, ds.y_test])
    assert sorted(everything.tolist()) == sorted(data["Smiling"].astype(int).tolist())


def test_an_imagenet_like_ood_pool_feeds_feddle_ood(tmp_path):
    """The OOD pool is drawn from its own image set at the clients' shape (§5.2) and Feddle-OOD
    fits its probe on it, with the §5.1 CNN (widths shrunk) on 3×8×8 client images."""
    import datasets

    rng = np.random.default_rng(4)
    save_cifar100_like(tmp_path / "c100", rng)
    pool = datasets.Dataset.from_dict(
        {"image": rgb(rng, 50, 20), "label": rng.integers(0, 7, 50)},
        features=datasets.Features(
            {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=7)}
        ),
    )
    pool.save_to_disk(str(tmp_path / "imagenet"))
    imagenet = {"preset": "imagenet", "path": str(tmp_path / "imagenet"), "load_from_disk": True}
    raw = {
        "seed": 0,
        "rounds": 2,
        "clients": {"num": 6, "per_round": 3},
        "data": {
            "name": "hf_image",
            "hf_image": {
                "preset": "cifar100_superclass",
                "path": str(tmp_path / "c100"),
                "load_from_disk": True,
            },
            "partition": {"kind": "dirichlet", "alpha": 0.3},
            "server": {
                "ood": [{"name": "imagenet", "kind": "hf_image", "size": 30, "hf_image": imagenet}]
            },
        },
        "model": {"name": "cnn", "channels": [4, 8, 8], "hidden": [16]},
        "local": {"epochs": 1, "batch_size": 16, "lr": 1e-2, "optimizer": "adam"},
        "algorithm": {"name": "feddle_ood", "server_epochs": 1, "ood_samples_per_round": 20},
    }
    core = local_core(load_config(raw))
    ds = core.executor.runner.dataset
    px, py, classes = ds.server_ood["imagenet"]
    assert px.shape == (30, 3, 8, 8) and classes == 7 and py.max() < 7
    while not core.done:
        core.step()
    assert np.isfinite(core.strategy.metrics()["feddle_probe_loss"])


def test_image_options_are_checked_before_anything_loads():
    with pytest.raises(ValueError, match="hf_image.preset or hf_image.path"):
        DataConfig(name="hf_image")
    with pytest.raises(ValueError, match="data.hf_image applies only to name='hf_image'"):
        DataConfig(name="digits", hf_image={"preset": "cifar10"})
    with pytest.raises(ValueError, match="exactly when kind is hf_image"):
        DataConfig(server={"ood": [{"kind": "hf_image"}]})
