"""The LM proxy of FedBaF spec §8.1: Markov chains A and B, the Transformer LM, its foundation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from safetensors.numpy import load_file

from raysim.actors.local import local_core
from raysim.algorithms.fedbaf.matching import match_layers
from raysim.config import load_config
from raysim.data import build_federated_dataset
from raysim.data.federated import DataConfig
from raysim.data.markov import MarkovConfig, chains, entropy_rate, markov_corpus
from raysim.models.pretrain_markov import (
    MarkovPretrainConfig,
    pretrain_markov,
    source_eval_set,
)
from raysim.models.pretraining import read_metadata
from raysim.models.registry import DataSpec, ModelConfig, build_handle
from tests.conftest import tiny

SMALL = {"train_tokens": 6400, "test_tokens": 1280}


def test_the_chains_share_seventy_percent_of_contexts_and_ignore_the_run_seed():
    cfg = MarkovConfig()
    a, b = chains(cfg)
    assert (a.vocab, b.vocab) == (300, 250)
    same = np.all(b.weights == a.weights, axis=-1)
    assert abs(same.mean() - 0.7) < 0.1
    folded = np.all(b.candidates == a.candidates % 250, axis=-1)
    assert np.all(folded[same])
    assert np.array_equal(markov_corpus(cfg)[0], markov_corpus(MarkovConfig())[0])
    assert not np.array_equal(markov_corpus(cfg)[0], markov_corpus(MarkovConfig(chain_seed=1))[0])
    # far more predictable than uniform: the best perplexity is a few dozen at most
    assert math.exp(entropy_rate(b)) < 20 < 250


def test_a_markov_run_gives_clients_contiguous_blocks_of_windows():
    data = DataConfig(name="markov", markov=SMALL, partition={"kind": "contiguous"})
    ds = build_federated_dataset(data, 4, seed=0)
    assert ds.input_kind == "tokens" and ds.vocab_size == 250 and ds.x_train.shape[1] == 32
    x0, y0 = ds.client_data(0)
    assert np.array_equal(x0[:, 1:], y0[:, :-1])  # targets are the inputs shifted by one
    blocks = [ds.client_train_indices(j) for j in range(4)]
    assert all(np.array_equal(b, np.arange(b[0], b[-1] + 1)) for b in blocks)
    assert [b[0] for b in blocks] == sorted(b[0] for b in blocks)
    with pytest.raises(
        ValueError, match="data.markov applies only to name='markov', not to name='digits'"
    ):
        DataConfig(name="digits", markov=SMALL)


def test_the_foundation_matches_the_federated_body_but_not_embedding_or_decoder(tmp_path):
    cfg = MarkovPretrainConfig(
        markov=MarkovConfig(corpus="foundation", **SMALL), epochs=4, batch_size=8
    )
    meta = pretrain_markov(cfg, tmp_path)
    assert read_metadata(tmp_path)["task"] == "markov"
    x, y = source_eval_set(cfg.markov)
    assert meta["heldout_perplexity"] < 200  # uniform over 300 tokens would be 300
    weights = load_file(str(tmp_path / "model.safetensors"))
    fl = build_handle(ModelConfig(name="transformer_lm"), DataSpec("tokens", (32,), 250, 250))
    shapes = {k: tuple(v.shape) for k, v in weights.items()}
    matches, unmatched = match_layers(fl.layout(), shapes, "exact", [])
    matched = {m.name for m in matches}
    assert {"embedding.weight", "decoder.weight", "decoder.bias"} <= set(unmatched)
    assert "encoder.layers.0.self_attn.in_proj_weight" in matched and len(matched) > 10
    assert len(x) == len(y) > 0


def test_fedbaf_runs_on_the_lm_proxy_and_logs_perplexity(tmp_path):
    pre = MarkovPretrainConfig(markov=MarkovConfig(corpus="foundation", **SMALL), epochs=1)
    pretrain_markov(pre, tmp_path)
    cfg = load_config(
        tiny(
            rounds=2,
            clients={"num": 4, "per_round": 4},
            data={"name": "markov", "markov": SMALL, "partition": {"kind": "contiguous"}},
            model={"name": "transformer_lm"},
            local={"epochs": 1, "batch_size": 20, "lr": 5.0, "max_grad_norm": 0.25},
            algorithm={"name": "fedbaf", "foundation": str(tmp_path)},
        )
    )
    core = local_core(cfg, evaluate=True)
    history = [core.step() for _ in range(2)]
    assert history[-1]["loss"] < history[0]["loss"] < math.log(250) + 0.5
    assert 1 <= history[0]["fedbaf_c"] <= 2
    assert history[-1]["perplexity"] == pytest.approx(math.exp(history[-1]["loss"]))


def test_noise_has_the_asked_norm_and_the_sweep_degrades_the_source_task(tmp_path):
    from raysim.algorithms.fedbaf.mixer import matched_foundation
    from raysim.security.noise import noise_sweep, noisy

    rng = np.random.default_rng(0)
    w = rng.normal(size=(40, 30)).astype(np.float32)
    for mode in ("rms", "magnitude"):
        out = noisy(w, 0.5, mode, rng)
        assert np.linalg.norm(out - w) / np.linalg.norm(w) == pytest.approx(0.5, rel=1e-5)
    pre = MarkovPretrainConfig(
        markov=MarkovConfig(corpus="foundation", **SMALL), epochs=4, batch_size=8
    )
    meta = pretrain_markov(pre, tmp_path)
    fl = build_handle(ModelConfig(name="transformer_lm"), DataSpec("tokens", (32,), 250, 250))
    truth = matched_foundation(fl.layout(), tmp_path, "exact")
    rows = noise_sweep(tmp_path, truth, [0.0, 2.0], seed=0, modes=["rms"])
    assert rows[0]["accuracy"] == pytest.approx(meta["heldout_accuracy"])
    assert rows[1]["loss"] > rows[0]["loss"] + 0.5
