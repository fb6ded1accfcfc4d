"""The LM proxy's foundation of fedbaf.md §8.1: a tiny Transformer LM trained on chain A.

``pretrain_markov`` trains ``transformer_lm`` (d_model 64, 2 layers, 2 heads, FFN 128, sequences
of 32) on chain A's corpus (300 tokens, ~200k tokens) and writes ``model.safetensors`` under the
global layout's names, next to ``raysim_foundation.json`` (settings and held-out perplexity). A
federated run on chain B (250 tokens) builds the same body with other embedding and decoder shapes,
so FedBaF's exact matcher mixes the body and leaves those two alone, as in WikiText-2 → PTB.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from raysim.data.markov import MarkovConfig, markov_corpus, windows
from raysim.models.registry import DataSpec, ModelConfig, build_handle
from raysim.schema import StrictModel

METADATA_FILE = "raysim_foundation.json"


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
    cfg: MarkovPretrainConfig,
    out_dir: str | Path,
    progress: Callable[[int, int, float], None] | None = None,
) -> dict[str, Any]:
    """Train on chain A; save weights and metadata in ``out_dir``; return the metadata."""
    from safetensors.numpy import save_file

    from raysim.training.loop import evaluate

    t0 = time.perf_counter()
    markov = cfg.markov.model_copy(update={"corpus": "foundation"})
    train, _, vocab = markov_corpus(markov)
    x, y = (torch.as_tensor(a) for a in windows(train, markov.seq_len))
    torch.manual_seed(cfg.seed)
    handle = build_handle(cfg.model, source_spec(markov))
    module = handle.module
    opt = torch.optim.Adam(module.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    steps_per_epoch = math.ceil(len(y) / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch
    step, loss = 0, float("nan")
    module.train()
    for _ in range(cfg.epochs):
        for idx in torch.randperm(len(y), generator=gen).split(cfg.batch_size):
            opt.zero_grad()
            out = torch.nn.functional.cross_entropy(module(x[idx]), y[idx])
            out.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            opt.step()
            step, loss = step + 1, float(out.detach())
            if progress is not None:
                progress(step, total, loss)
    ex, ey = (torch.as_tensor(a) for a in source_eval_set(markov))
    scores = evaluate(module, ex, ey)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: np.ascontiguousarray(v)
        for k, v in handle.layout().unflatten(handle.get_global()).items()
    }
    save_file(tensors, str(out_dir / "model.safetensors"))
    meta = {
        "task": "markov",
        "markov": markov.model_dump(mode="json"),
        "model": cfg.model.model_dump(mode="json"),
        "epochs": cfg.epochs,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "vocab_size": vocab,
        "parameters": int(sum(v.size for v in tensors.values())),
        "heldout_loss": scores["loss"],
        "heldout_perplexity": math.exp(scores["loss"]),
        "heldout_accuracy": scores["accuracy"],
        "pretrain_seconds": time.perf_counter() - t0,
    }
    (out_dir / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    return meta


def read_metadata(path: str | Path) -> dict[str, Any] | None:
    """A foundation's ``raysim_foundation.json`` (the directory, or a file inside it), or None."""
    p = Path(path)
    meta = (p if p.is_dir() else p.parent) / METADATA_FILE
    return json.loads(meta.read_text()) if meta.is_file() else None
