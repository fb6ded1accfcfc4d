"""The synthetic language task of FedBaF spec §8.1 (LM proxy): two related order-2 Markov chains.

Chain A (the foundation's corpus, 300 tokens) and chain B (the federated corpus, 250 tokens)
share A's transition structure on ``shared`` (70 %) of B's contexts; B's other rows are drawn
afresh. The vocabularies differ in size, so a model's embedding and decoder do not match between
the two (the WikiText-2 → PTB case, §4.1).

So that a small corpus can teach a small Transformer an order-2 chain, the next token depends on
the previous two through their latent classes (``classes`` of them, fixed per token): a context is
a pair of classes, with ``branching`` candidate next tokens under Dirichlet weights. B's tokens
keep A's classes; B's shared rows are A's rows with candidates folded into B's vocabulary
(``token mod V_B``). Both choices are interpretations: §8.1 leaves "transition structure" open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field

from raysim.data.builtin import RawData
from raysim.schema import StrictModel

MARKOV_TAG = 0x3A4B  # rng = default_rng([chain_seed, MARKOV_TAG, ...]); independent of the run seed


class MarkovConfig(StrictModel):
    """``data.markov`` (FedBaF spec §8.1, LM proxy)."""

    corpus: Literal["federated", "foundation"] = Field(
        "federated", description="federated: chain B (the FL task); foundation: chain A"
    )
    chain_seed: int = Field(0, description="fixes both chains and corpora, whatever the run seed")
    vocab_foundation: int = Field(300, ge=4, description="tokens of chain A (the foundation)")
    vocab_federated: int = Field(250, ge=4, description="tokens of chain B (the FL task)")
    shared: float = Field(0.7, ge=0, le=1, description="share of B's contexts that follow A")
    classes: int = Field(16, ge=1, description="latent token classes; a context is a class pair")
    branching: int = Field(12, ge=1, description="candidate next tokens per context")
    concentration: float = Field(0.5, gt=0, description="Dirichlet over a context's candidates")
    train_tokens: int = Field(40_000, ge=64, description="tokens of the corpus used for training")
    test_tokens: int = Field(8_000, ge=64, description="held-out tokens (perplexity)")
    seq_len: int = Field(32, ge=2, description="tokens per training window")


@dataclass(frozen=True)
class Chain:
    """An order-2 chain: token classes ``cls`` (V,); for the class pair of the last two tokens,
    ``candidates`` (C, C, branching) next tokens with ``weights``."""

    cls: np.ndarray
    candidates: np.ndarray
    weights: np.ndarray

    @property
    def vocab(self) -> int:
        return len(self.cls)

    def sample(self, n: int, rng: np.random.Generator, streams: int = 64) -> np.ndarray:
        """``n`` tokens: ``streams`` independent walks, vectorised, concatenated."""
        per = -(-n // streams)
        out = np.empty((streams, per), np.int64)
        a = self.cls[rng.integers(self.vocab, size=streams)]
        b = self.cls[rng.integers(self.vocab, size=streams)]
        cum = np.cumsum(self.weights, axis=-1)
        for i in range(per):
            u = rng.random(streams)[:, None]
            k = np.minimum((u > cum[a, b]).sum(axis=1), cum.shape[-1] - 1)
            nxt = self.candidates[a, b, k]
            out[:, i] = nxt
            a, b = b, self.cls[nxt]
        return out.reshape(-1)[:n]


def chains(cfg: MarkovConfig) -> tuple[Chain, Chain]:
    """Chains A (foundation) and B (federated), from ``chain_seed`` only."""
    rng = np.random.default_rng([cfg.chain_seed, MARKOV_TAG])
    va, vb, k, c = cfg.vocab_foundation, cfg.vocab_federated, cfg.branching, cfg.classes
    cls_a = rng.integers(c, size=va)
    cand_a = rng.integers(va, size=(c, c, k))
    w_a = rng.dirichlet(np.full(k, cfg.concentration), size=(c, c))
    shared = rng.random((c, c)) < cfg.shared
    cand_b = np.where(shared[..., None], cand_a % vb, rng.integers(vb, size=(c, c, k)))
    fresh = rng.dirichlet(np.full(k, cfg.concentration), size=(c, c))
    w_b = np.where(shared[..., None], w_a, fresh)
    return Chain(cls_a, cand_a, w_a), Chain(cls_a[:vb], cand_b, w_b)


def windows(tokens: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows: inputs ``(N, L)`` and next-token targets ``(N, L)``."""
    n = (len(tokens) - 1) // seq_len
    x = tokens[: n * seq_len].reshape(n, seq_len)
    y = tokens[1 : n * seq_len + 1].reshape(n, seq_len)
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def markov_corpus(cfg: MarkovConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """The configured corpus as (train tokens, test tokens, vocabulary size)."""
    a, b = chains(cfg)
    chain = a if cfg.corpus == "foundation" else b
    which = 0 if cfg.corpus == "foundation" else 1
    rng = np.random.default_rng([cfg.chain_seed, MARKOV_TAG, which])
    tokens = chain.sample(cfg.train_tokens + cfg.test_tokens, rng)
    return tokens[: cfg.train_tokens], tokens[cfg.train_tokens :], chain.vocab


def entropy_rate(chain: Chain) -> float:
    """Mean next-token entropy over class-pair contexts (nats), duplicate candidates merged: the
    log of the perplexity a perfect model reaches under uniform contexts (a reference)."""
    c, k = chain.weights.shape[0], chain.weights.shape[-1]
    probs = np.zeros((c * c, chain.vocab))
    rows = np.repeat(np.arange(c * c), k)
    np.add.at(probs, (rows, chain.candidates.reshape(-1)), chain.weights.reshape(-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(probs > 0, probs * np.log(probs), 0.0).sum(axis=1)
    return float(h.mean())


def load_markov(cfg: MarkovConfig) -> RawData:
    """The corpus as windows: inputs and next-token targets ``(N, seq_len)``, in corpus order
    (``partition.kind: contiguous`` gives each client a block), with its own test split."""
    train, test, vocab = markov_corpus(cfg)
    x, y = windows(train, cfg.seq_len)
    xt, yt = windows(test, cfg.seq_len)
    return RawData(x, y, num_classes=vocab, x_test=xt, y_test=yt, token_vocab=vocab)
