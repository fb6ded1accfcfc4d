"""Word-level language modelling corpora through HF ``datasets`` (FedBaF spec §4.1: WikiText-2 for
the foundation, Penn Treebank for the federated task), as PyTorch's word_language_model reads them.

Each non-empty line is split on whitespace and ends with ``<eos>``; the vocabulary is the train
split's words by frequency (``<unk>`` = 0, ``<eos>`` = 1), capped at ``vocab_size``; the token
stream is cut into windows of ``seq_len`` (bptt) with next-token targets. Clients get contiguous
blocks (``partition.kind: contiguous``, §4.2's sequential grouping).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from raysim.data.builtin import RawData
from raysim.data.hf import HFSource, load_split
from raysim.data.markov import windows

UNK, EOS = "<unk>", "<eos>"

PRESETS: dict[str, dict[str, Any]] = {
    "wikitext2": {
        "path": "Salesforce/wikitext",
        "name": "wikitext-2-raw-v1",
        "text_column": "text",
        "test_split": "test",
    },
    "ptb": {"path": "ptb-text-only/ptb_text_only", "text_column": "sentence", "test_split": "test"},
}


class HFTextLMConfig(HFSource):
    """``data.hf_lm`` (``data.name: hf_lm``); a ``preset`` fills the fields the config leaves."""

    preset: Literal["wikitext2", "ptb"] | None = Field(
        None,
        description="WikiText-2 or Penn Treebank: fills path, name, text_column and test_split "
        "(a key the config sets wins); None: give path",
    )
    text_column: str = Field("text", description="the column of the text lines")
    test_split: str | None = Field(
        "test", description="the split perplexity is measured on (required)"
    )
    seq_len: int = Field(35, ge=2, description="tokens per window (bptt)")
    vocab_size: int | None = Field(None, ge=3, description="None: every train word")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            return {**PRESETS[data["preset"]], **data}
        return data

    def check(self) -> None:
        if not self.path:
            raise ValueError("data.name='hf_lm' needs hf_lm.preset or hf_lm.path")
        if self.test_split is None:
            raise ValueError("data.name='hf_lm' needs a test split (hf_lm.test_split)")


def words(lines: list[str]) -> list[str]:
    """Whitespace tokens of every non-empty line, each line closed by ``<eos>``."""
    out: list[str] = []
    for line in lines:
        parts = line.split()
        if parts:
            out += [*parts, EOS]
    return out


def build_word_vocab(tokens: list[str], size: int | None) -> dict[str, int]:
    """``<unk>``, ``<eos>``, then words by descending count (ties by the word)."""
    counts = Counter(t for t in tokens if t not in (UNK, EOS))
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    if size is not None:
        ranked = ranked[: size - 2]
    return {UNK: 0, EOS: 1, **{w: i + 2 for i, w in enumerate(ranked)}}


def _ids(tokens: list[str], vocab: dict[str, int]) -> np.ndarray:
    return np.array([vocab.get(t, 0) for t in tokens], dtype=np.int64)


def load_text_lm(cfg: HFTextLMConfig) -> RawData:
    """Train and test windows of the corpus, with the train split's vocabulary."""
    train = words(list(load_split(cfg, cfg.train_split)[cfg.text_column]))
    test = words(list(load_split(cfg, cfg.test_split)[cfg.text_column]))
    vocab = build_word_vocab(train, cfg.vocab_size)
    x, y = windows(_ids(train, vocab), cfg.seq_len)
    xt, yt = windows(_ids(test, vocab), cfg.seq_len)
    return RawData(x, y, num_classes=len(vocab), x_test=xt, y_test=yt, token_vocab=len(vocab))
