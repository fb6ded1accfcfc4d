"""A small word-level tokenizer for bag-of-embeddings text classification.

Ids: 0 = padding, 1 = unknown, 2.. = vocabulary words by descending train frequency.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import numpy as np

PAD_ID = 0
UNK_ID = 1
_WORD = re.compile(r"[a-z0-9']+")


def tokenize(text: str | None) -> list[str]:
    """Lowercase and split into ``[a-z0-9']+`` words."""
    return _WORD.findall((text or "").lower())


def build_vocab(texts: Iterable[str | None], vocab_size: int) -> dict[str, int]:
    """Map the ``vocab_size-2`` most frequent words (ties alphabetical) to ids 2.."""
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be >= 3 (pad, unk and one word), got {vocab_size}")
    counts = Counter(w for t in texts for w in tokenize(t))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: vocab_size - 2]
    return {word: i + 2 for i, (word, _) in enumerate(ranked)}


def encode(texts: Iterable[str | None], vocab: dict[str, int], max_tokens: int) -> np.ndarray:
    """Encode texts to an int64 ``(N, max_tokens)`` array, truncated and 0-padded."""
    rows = []
    for t in texts:
        ids = [vocab.get(w, UNK_ID) for w in tokenize(t)[:max_tokens]]
        rows.append(ids + [PAD_ID] * (max_tokens - len(ids)))
    return np.array(rows, dtype=np.int64).reshape(len(rows), max_tokens)
