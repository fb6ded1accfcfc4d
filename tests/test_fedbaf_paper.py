"""FedBaF's paper-scale pieces (FedBaF spec §4.1, §8.2): PreAct-ResNet-18, full ViT, word-level
LM corpora through HF ``datasets``, and the paper configs in ``examples/fedbaf/paper``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from raysim.config import load_config
from raysim.data import build_federated_dataset
from raysim.data.federated import DataConfig
from raysim.data.text_lm import build_word_vocab, words
from raysim.models.registry import DataSpec, ModelConfig, build_handle

PAPER = Path(__file__).parents[1] / "examples" / "fedbaf" / "paper"


def test_preact_resnet18_has_the_cifar_stem_and_its_parameter_count():
    h = build_handle(
        ModelConfig(name="preact_resnet", image={"size": None}), DataSpec("dense", (3, 32, 32), 10)
    )
    trained = sum(p.numel() for p in h.module.parameters())
    # kuangliu/pytorch-cifar's PreActResNet18 has 11,171,146; He et al.'s final BN adds 2·512
    assert trained == 11_171_146 + 1024
    names = [n for n, _ in h.layout().shapes()]
    assert names[0] == "classifier.stem.weight" and h.layout().shapes()[0][1] == (64, 3, 3, 3)
    assert "classifier.classifier.weight" in names  # the head, unmatched across class counts


def test_the_full_vit_trains_every_tensor():
    cfg = ModelConfig(
        name="vit",
        image={"size": 32},
        vit={
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
        },
    )
    h = build_handle(cfg, DataSpec("dense", (3, 32, 32), 5))
    total = sum(p.numel() for p in h.module.parameters())
    assert len(h.get_global()) == total


def test_word_level_corpora_load_through_datasets_as_windows(tmp_path):
    import datasets

    lines = ["the cat sat", "", "the dog sat down", "a cat"] * 20
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"sentence": lines}),
            "test": datasets.Dataset.from_dict({"sentence": ["the bird sat"] * 30}),
        }
    ).save_to_disk(str(tmp_path / "ptb"))
    data = DataConfig(
        name="hf_lm",
        hf_lm={
            "path": str(tmp_path / "ptb"),
            "load_from_disk": True,
            "text_column": "sentence",
            "seq_len": 5,
        },
        partition={"kind": "contiguous"},
    )
    ds = build_federated_dataset(data, 3, seed=0)
    vocab = build_word_vocab(words(lines), None)
    assert ds.vocab_size == len(vocab) == 2 + 6  # <unk>, <eos> and six words
    assert ds.x_train.shape[1] == 5 and np.array_equal(ds.x_train[:, 1:], ds.y_train[:, :-1])
    assert "bird" not in vocab and (ds.x_test == vocab["<unk>"]).any()  # unseen → <unk>
    assert DataConfig(name="hf_lm", hf_lm={"preset": "ptb"}).hf_lm.text_column == "sentence"


@pytest.mark.parametrize(
    "path", sorted([*PAPER.glob("*.yaml"), *PAPER.parent.glob("mini*.yaml")]), ids=lambda p: p.name
)
def test_the_paper_configs_validate(path):
    cfg = load_config(yaml.safe_load(path.read_text()))
    assert cfg.rounds >= 1
    if cfg.algorithm.name == "fedbaf":
        assert cfg.algorithm.params.foundation.startswith("foundations/")
