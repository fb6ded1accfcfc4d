"""The LM proxy's foundation of FedBaF spec §8.1: a tiny Transformer LM trained on chain A.

``pretrain_markov`` trains ``transformer_lm`` (d_model 64, 2 layers, 2 heads, FFN 128, sequences
of 32) on chain A's corpus (300 tokens, ~200k tokens) and writes ``model.safetensors`` under the
global layout's names, next to ``raysim_foundation.json`` (settings and held-out perplexity). A
federated run on chain B (250 tokens) builds the same body with other embedding and decoder shapes,
so FedBaF's exact matcher mixes the body and leaves those two alone, as in WikiText-2 → PTB.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from raysim.data.markov import MarkovConfig, markov_corpus, windows
from raysim.models.pretraining import Progress, save_foundation, train_supervised
from raysim.models.registry import DataSpec, ModelConfig, build_handle
from raysim.schema import StrictModel


def _default_model() -> ModelConfig:
    return ModelConfig(name="transformer_lm", embed_dim=64)


class MarkovPretrainConfig(StrictModel):
    """Pre-training of the LM proxy's foundation (§8.1: chain A, ~200k tokens)."""

    markov: MarkovConfig = Field(
        default_factory=lambda: MarkovConfig(corpus="foundation", train_tokens=200_000)
    )
    model: ModelConfig = Field(default_factory=_default_model)
    epochs: int = Field(6, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-3, gt=0)
    seed: int = 0


def source_spec(markov: MarkovConfig) -> DataSpec:
    vocab = markov.vocab_foundation
    return DataSpec("tokens", (markov.seq_len,), vocab, vocab)


def source_eval_set(markov: MarkovConfig) -> tuple[np.ndarray, np.ndarray]:
    """Chain A's held-out windows: the foundation's own task (noise sweep, Fig. 8)."""
    _, test, _ = markov_corpus(markov.model_copy(update={"corpus": "foundation"}))
    return windows(test, markov.seq_len)


def pretrain_markov(
    cfg: MarkovPretrainConfig, out_dir: str | Path, progress: Progress | None = None
) -> dict[str, Any]:
    """Train on chain A; save weights and metadata in ``out_dir``; return the metadata."""
    from raysim.training.loop import evaluate

    t0 = time.perf_counter()
    markov = cfg.markov.model_copy(update={"corpus": "foundation"})
    train, _, vocab = markov_corpus(markov)
    x, y = (torch.as_tensor(a) for a in windows(train, markov.seq_len))
    torch.manual_seed(cfg.seed)
    handle = build_handle(cfg.model, source_spec(markov))
    opt = torch.optim.Adam(handle.module.parameters(), lr=cfg.lr)
    train_supervised(
        handle.module, x, y, opt, cfg.epochs, cfg.batch_size, cfg.seed, progress, max_grad_norm=1.0
    )
    scores = evaluate(handle.module, *(torch.as_tensor(a) for a in source_eval_set(markov)))
    meta = {
        "task": "markov",
        "markov": markov.model_dump(mode="json"),
        "model": cfg.model.model_dump(mode="json"),
        "epochs": cfg.epochs,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "vocab_size": vocab,
        "heldout_loss": scores["loss"],
        "heldout_perplexity": math.exp(scores["loss"]),
        "heldout_accuracy": scores["accuracy"],
        "pretrain_seconds": time.perf_counter() - t0,
    }
    return save_foundation(handle, out_dir, meta)
