"""Tests for raysim.data: partitions, built-in datasets, HF local files, errors."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from raysim.data import (  # noqa: E402
    DataConfig,
    FederatedDataset,
    HFConfig,
    PartitionConfig,
    build_federated_dataset,
)
from raysim.data import partition as part  # noqa: E402
from raysim.data.text import build_vocab, encode, tokenize  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def _arrays(ds: FederatedDataset) -> list[np.ndarray]:
    return [ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.client_indices, ds.client_offsets]


def _assert_covers(parts: list[np.ndarray], n: int) -> None:
    allidx = np.concatenate(parts)
    assert len(allidx) == n
    assert np.array_equal(np.sort(allidx), np.arange(n))
    for p in parts:
        assert np.all(np.diff(p) > 0)  # sorted within client, no repeats


def _mean_entropy(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> float:
    ent = []
    for p in parts:
        q = np.bincount(labels[p], minlength=num_classes) / len(p)
        q = q[q > 0]
        ent.append(float(-(q * np.log(q)).sum()))
    return float(np.mean(ent))


# ---------------------------------------------------------------- partition functions


def test_iid_equal_sizes_when_divisible() -> None:
    parts = part.iid(1000, 10, np.random.default_rng(0))
    assert [len(p) for p in parts] == [100] * 10
    _assert_covers(parts, 1000)


def test_iid_sizes_differ_by_at_most_one() -> None:
    sizes = [len(p) for p in part.iid(1003, 10, np.random.default_rng(0))]
    assert max(sizes) - min(sizes) == 1 and sum(sizes) == 1003


def test_dirichlet_min_size_and_coverage() -> None:
    labels = np.random.default_rng(0).integers(0, 10, 2000)
    parts = part.dirichlet(labels, 50, 0.1, np.random.default_rng(1), min_size=5)
    assert min(len(p) for p in parts) >= 5
    _assert_covers(parts, 2000)


def test_dirichlet_smaller_alpha_is_more_skewed() -> None:
    labels = np.random.default_rng(0).integers(0, 10, 5000)
    skewed = part.dirichlet(labels, 20, 0.05, np.random.default_rng(1), min_size=1)
    uniform = part.dirichlet(labels, 20, 100.0, np.random.default_rng(1), min_size=1)
    low, high = _mean_entropy(labels, skewed, 10), _mean_entropy(labels, uniform, 10)
    assert low < 0.6 * high
    assert high > 0.95 * np.log(10)


def test_dirichlet_gives_up_after_redraws() -> None:
    labels = np.repeat([0, 1], 100)
    with pytest.raises(ValueError, match="min_size=1 samples after 1000 draws"):
        part.dirichlet(labels, 10, 1e-3, np.random.default_rng(0), min_size=1)


def test_dirichlet_impossible_min_size() -> None:
    with pytest.raises(ValueError, match="min_size=5"):
        part.dirichlet(np.zeros(20, np.int64), 10, 1.0, np.random.default_rng(0), min_size=5)


def test_shards_limit_distinct_labels() -> None:
    labels = np.repeat(np.arange(10), 120)  # 60 shards of 20: every shard holds one label
    parts = part.shards(labels, 20, 3, np.random.default_rng(0))
    assert all(len(np.unique(labels[p])) <= 3 for p in parts)
    assert any(len(np.unique(labels[p])) > 1 for p in parts)
    assert all(len(p) == 60 for p in parts)
    _assert_covers(parts, 1200)


def test_natural_groups_match_ids() -> None:
    ids = np.array(["b", "a", "c", "a", "b", "b"], dtype=object)
    parts = part.natural(ids)
    assert [p.tolist() for p in parts] == [[1, 3], [0, 4, 5], [2]]
    int_parts = part.natural(np.array([7, 3, 7, 3, 5]))
    assert [p.tolist() for p in int_parts] == [[1, 3], [4], [0, 2]]


def test_pack_offsets() -> None:
    idx, off = part.pack([np.array([2, 5]), np.array([0]), np.array([1, 3, 4])])
    assert idx.tolist() == [2, 5, 0, 1, 3, 4] and off.tolist() == [0, 2, 3, 6]
    assert idx.dtype == np.int64 and off.dtype == np.int64


def test_more_clients_than_samples() -> None:
    with pytest.raises(ValueError, match=r"num_clients \(11\) exceeds .* \(10\)"):
        part.iid(10, 11, np.random.default_rng(0))
    cfg = DataConfig(name="digits", partition=PartitionConfig(kind="iid"))
    with pytest.raises(ValueError, match="exceeds the number of training samples"):
        build_federated_dataset(cfg, 5000, 0)


# ---------------------------------------------------------------- text


def test_tokenizer_vocab_and_encoding() -> None:
    assert tokenize("Don't STOP, 42x!") == ["don't", "stop", "42x"]
    vocab = build_vocab(["b a a", "c b a", "d"], vocab_size=4)
    assert vocab == {"a": 2, "b": 3}  # c and d tie at 1; only 2 slots
    enc = encode(["a z b a", ""], vocab, max_tokens=3)
    assert enc.tolist() == [[2, 1, 3], [0, 0, 0]] and enc.dtype == np.int64


# ---------------------------------------------------------------- built-in datasets


def test_digits_dirichlet_100_clients_deterministic() -> None:
    cfg = DataConfig(name="digits", partition=PartitionConfig(kind="dirichlet", alpha=0.3))
    a = build_federated_dataset(cfg, 100, seed=0)
    b = build_federated_dataset(cfg, 100, seed=0)
    c = build_federated_dataset(cfg, 100, seed=1)
    assert len(a.y_train) + len(a.y_test) == 1797
    assert len(a.y_test) == round(1797 * 0.2)
    assert a.num_clients == 100 and a.client_sizes().min() >= 1
    assert a.client_sizes().sum() == len(a.y_train)
    assert a.x_train.dtype == np.float32 and a.feature_shape == (64,)
    assert a.y_train.dtype == np.int64 and a.input_kind == "dense"
    assert 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0
    assert all(np.array_equal(x, y) for x, y in zip(_arrays(a), _arrays(b), strict=True))
    assert not np.array_equal(a.client_indices, c.client_indices)
    assert not np.array_equal(a.y_test, c.y_test)
    x0, y0 = a.client_data(0)
    assert len(x0) == a.client_sizes()[0] and np.array_equal(
        y0, a.y_train[a.client_indices[: len(y0)]]
    )
    s = a.summary()
    assert s["num_train"] + s["num_test"] == 1797 and s["client_size"]["min"] >= 1
    assert sum(s["train_label_counts"]) == len(a.y_train)


def test_split_independent_of_partition_kind() -> None:
    a = build_federated_dataset(DataConfig(partition=PartitionConfig(kind="iid")), 10, seed=3)
    b = build_federated_dataset(DataConfig(partition=PartitionConfig(kind="shards")), 10, seed=3)
    assert np.array_equal(a.x_test, b.x_test) and np.array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.client_indices, b.client_indices)


def test_mnist1d_builds() -> None:
    state = np.random.get_state()[1].copy()
    ds = build_federated_dataset(DataConfig(name="mnist1d"), 10, seed=0)
    assert np.array_equal(np.random.get_state()[1], state)  # global RNG left alone
    assert len(ds.y_train) + len(ds.y_test) == 5000
    assert ds.feature_shape == (40,) and ds.x_train.dtype == np.float32
    assert ds.num_classes == 10 and set(np.unique(ds.y_train)) == set(range(10))
    assert not os.path.exists("mnist1d_data.pkl")


def test_bbc_news_tokens() -> None:
    cfg = DataConfig(name="bbc_news", vocab_size=300, max_tokens=64)
    ds = build_federated_dataset(cfg, 8, seed=0)
    assert ds.num_classes == 5 and ds.input_kind == "tokens"
    assert len(ds.y_train) + len(ds.y_test) == 2225
    assert ds.x_train.shape == (len(ds.y_train), 64) and ds.x_train.dtype == np.int64
    assert ds.vocab_size == 300 and ds.x_train.max() < 300 and ds.x_test.max() < 300
    assert (ds.x_train == 1).any() and (ds.x_train >= 2).any()
    again = build_federated_dataset(cfg, 8, seed=0)
    assert np.array_equal(ds.x_train, again.x_train)
    assert np.array_equal(ds.y_train, again.y_train)


# ---------------------------------------------------------------- Hugging Face local files


def _frame(n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta"]
    labels = np.array(["cat", "dog", "eel"])[np.arange(n) % 3]
    return pd.DataFrame(
        {
            "f1": rng.normal(size=n),
            "f2": rng.integers(0, 5, n),
            "label": labels,
            "writer": [f"w{i % 4}" for i in range(n)],
            "text": [f"{lab} {words[i % 4]} {words[(i * 7) % 4]}" for i, lab in enumerate(labels)],
        }
    )


@pytest.fixture
def files(tmp_path):
    df = _frame()
    df.to_csv(tmp_path / "d.csv", index=False)
    df.to_parquet(tmp_path / "d.parquet")
    df.iloc[:20].to_parquet(tmp_path / "test.parquet")
    return tmp_path, df


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_hf_features_natural(files, fmt: str) -> None:
    tmp, df = files
    hf = HFConfig(
        path=fmt,
        data_files=str(tmp / f"d.{fmt}"),
        feature_columns=["f1", "f2"],
        client_column="writer",
        cache_dir=str(tmp / "cache"),
    )
    cfg = DataConfig(
        name="hf", hf=hf, test_fraction=0.25, partition=PartitionConfig(kind="natural")
    )
    ds = build_federated_dataset(cfg, 4, seed=0)
    assert ds.x_train.shape == (45, 2) and ds.x_test.shape == (15, 2)
    assert ds.num_classes == 3 and ds.input_kind == "dense"
    # rebuild the expected natural groups from the frame: x_train rows are df rows in order
    rows = np.array([np.flatnonzero(np.isclose(df.f1, v))[0] for v in ds.x_train[:, 0]])
    expected_labels = np.searchsorted(["cat", "dog", "eel"], df.label.to_numpy()[rows])
    assert np.array_equal(ds.y_train, expected_labels)
    writers = df.writer.to_numpy()[rows]
    for j, w in enumerate(["w0", "w1", "w2", "w3"]):
        assert np.array_equal(ds.client_train_indices(j), np.flatnonzero(writers == w))


def test_hf_text_with_test_split(files) -> None:
    tmp, _ = files
    hf = HFConfig(
        path="parquet",
        data_files={"train": str(tmp / "d.parquet"), "test": str(tmp / "test.parquet")},
        test_split="test",
        text_column="text",
        cache_dir=str(tmp / "cache"),
    )
    cfg = DataConfig(
        name="hf", hf=hf, vocab_size=6, max_tokens=5, partition=PartitionConfig(kind="iid")
    )
    ds = build_federated_dataset(cfg, 3, seed=0)
    assert ds.x_train.shape == (60, 5) and ds.x_test.shape == (20, 5)
    assert ds.input_kind == "tokens" and ds.vocab_size == 6 and ds.x_train.max() <= 5
    assert (ds.x_train[:, 3:] == 0).all()  # 3 words then padding
    assert ds.client_sizes().tolist() == [20, 20, 20]


def test_hf_load_from_disk_int_labels(tmp_path) -> None:
    import datasets

    df = _frame().assign(label=np.arange(60) % 3 + 1)
    datasets.Dataset.from_pandas(df).save_to_disk(str(tmp_path / "saved"))
    hf = HFConfig(path=str(tmp_path / "saved"), load_from_disk=True, feature_columns=["f1"])
    ds = build_federated_dataset(DataConfig(name="hf", hf=hf), 2, seed=0)
    assert ds.num_classes == 4 and set(np.unique(ds.y_train)) <= {1, 2, 3}
    assert ds.feature_shape == (1,)


def test_hf_natural_wrong_client_count(files) -> None:
    tmp, _ = files
    hf = HFConfig(
        path="csv",
        data_files=str(tmp / "d.csv"),
        feature_columns=["f1"],
        client_column="writer",
        cache_dir=str(tmp / "cache"),
    )
    cfg = DataConfig(name="hf", hf=hf, partition=PartitionConfig(kind="natural"))
    with pytest.raises(ValueError, match="found 4 distinct client ids"):
        build_federated_dataset(cfg, 10, seed=0)


def test_hf_missing_column(files) -> None:
    tmp, _ = files
    hf = HFConfig(
        path="csv",
        data_files=str(tmp / "d.csv"),
        feature_columns=["nope"],
        cache_dir=str(tmp / "cache"),
    )
    with pytest.raises(ValueError, match="'nope'.* not found"):
        build_federated_dataset(DataConfig(name="hf", hf=hf), 2, seed=0)


# ---------------------------------------------------------------- config errors


def test_hf_needs_features_or_text() -> None:
    with pytest.raises(ValueError, match="exactly one of hf.feature_columns"):
        DataConfig(name="hf", hf=HFConfig(path="csv", data_files="x.csv"))


def test_natural_needs_client_column() -> None:
    with pytest.raises(ValueError, match="natural.*client_column"):
        DataConfig(name="digits", partition=PartitionConfig(kind="natural"))


def test_config_typo_named() -> None:
    with pytest.raises(ValueError, match="did you mean 'alpha'"):
        DataConfig.model_validate({"partition": {"kind": "dirichlet", "alpah": 0.1}})


def test_digits_are_sklearns_digits_read_without_importing_sklearn() -> None:
    """``load_digits`` reads sklearn's shipped file itself (start-up cost): the same arrays."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits as sklearn_digits

    from raysim.data.builtin import load_digits

    raw, bunch = load_digits(), sklearn_digits()
    np.testing.assert_array_equal(raw.x, (bunch.data / 16.0).astype(np.float32))
    np.testing.assert_array_equal(raw.y, bunch.target)
    probe = "import sys; from raysim.data.builtin import load_digits; load_digits(); "
    probe += "print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
