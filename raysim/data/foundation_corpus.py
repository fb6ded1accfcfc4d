"""A generic instruction corpus for the tiny "foundation" model (FedOA spec §7.1).

Auxiliary families, disjoint from the evaluation tasks (no entailment, sentiment, paraphrase or
reading-comprehension question): copy a word, first word, last word, longest option, and which
option appears in the text. They use the same template and the same ``OPTIONS:\\n- …`` convention
as Flan-mini, and the content words of both Flan-mini domains, so a model pre-trained on them is
format-aware (answers with one listed option) and knows every word, as a real foundation model
would, without having seen any evaluation task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from raysim.data.flan_mini import _OPTIONS, WordPool, word_pools
from raysim.data.instructions import TextExample

FOUNDATION_TAG = 13  # rng = default_rng([seed, FOUNDATION_TAG, split]) for the corpus
METADATA_FILE = "raysim_foundation.json"  # written next to a pre-trained foundation model

_WORDINGS: dict[str, tuple[str, ...]] = {
    "copy": ("Repeat the word {w}.", "Copy this word: {w}"),
    "first_word": (
        "Text: {t}\nWhat is the first word of the text?",
        "{t}\nWhich word comes first?",
    ),
    "last_word": (
        "Text: {t}\nWhat is the last word of the text?",
        "{t}\nWhich word comes last?",
    ),
    "longest_option": ("Which option is the longest?", "Pick the longest of the options."),
    "option_in_text": (
        "Text: {t}\nWhich of the options appears in the text?",
        "{t}\nOne option is mentioned above. Which one?",
    ),
}
FOUNDATION_FAMILIES: tuple[str, ...] = tuple(_WORDINGS)


def _options(options: list[str]) -> str:
    return "OPTIONS:\n" + "\n".join(f"- {o}" for o in options)


#: share of answer-word slots filled with a Flan-mini label word or phrase instead of a pool word
LABEL_SHARE = 0.3


class _Units:
    """What options and texts are made of: pool words and, with probability ``LABEL_SHARE``, the
    label words and phrases of Flan-mini (yes, positive, "it is not possible to tell", 0-5, ...),
    so the model learns to answer with *any* listed option, not only with content words."""

    def __init__(self, pools: dict[str, WordPool]) -> None:
        self.words = sorted(set().union(*(p.words() for p in pools.values())))
        labels = sorted({o for opts in _OPTIONS.values() for o in opts})
        self.labels = labels
        self.label_words = [o for o in labels if " " not in o]

    def pick(self, rng: np.random.Generator, k: int, phrases: bool = True) -> list[str]:
        """``k`` distinct units; single words only unless ``phrases``."""
        labels = self.labels if phrases else self.label_words
        out: list[str] = []
        while len(out) < k:
            source = labels if rng.random() < LABEL_SHARE else self.words
            unit = source[int(rng.integers(len(source)))]
            if unit not in out:
                out.append(unit)
        return out


def _shuffle(rng: np.random.Generator, items: list[str]) -> list[str]:
    return [items[i] for i in rng.permutation(len(items))]


def _copy(rng: np.random.Generator, units: _Units) -> tuple[dict, list[str], str]:
    picked = units.pick(rng, 4)
    return {"w": picked[0]}, _shuffle(rng, picked), picked[0]


def _position(first: bool) -> Callable:
    def gen(rng: np.random.Generator, units: _Units) -> tuple[dict, list[str], str]:
        text = units.pick(rng, int(rng.integers(4, 8)), phrases=False)
        answer = text[0] if first else text[-1]
        others = [w for w in text if w != answer]
        options = [answer, *(others[i] for i in rng.choice(len(others), 3, replace=False))]
        return {"t": " ".join(text) + "."}, _shuffle(rng, options), answer

    return gen


def _longest(rng: np.random.Generator, units: _Units) -> tuple[dict, list[str], str]:
    lengths = [int(x) for x in rng.choice([1, 2, 3, 4, 5], 3, replace=False)]
    options = [" ".join(units.pick(rng, k, phrases=False)) for k in lengths]
    return {}, options, options[int(np.argmax(lengths))]


def _option_in_text(rng: np.random.Generator, units: _Units) -> tuple[dict, list[str], str]:
    n = int(rng.integers(3, 7))
    chosen = units.pick(rng, n + 3)
    text, absent = chosen[:n], chosen[n:]
    answer = text[int(rng.integers(n))]
    return {"t": " ".join(text) + "."}, _shuffle(rng, [answer, *absent]), answer


_GENERATORS: dict[str, Callable] = {
    "copy": _copy,
    "first_word": _position(first=True),
    "last_word": _position(first=False),
    "longest_option": _longest,
    "option_in_text": _option_in_text,
}


def generate_foundation_corpus(
    seed: int, n: int, split: int = 0, families: Sequence[str] = FOUNDATION_FAMILIES
) -> list[TextExample]:
    """``n`` examples cycling through the families, deterministic in ``(seed, split)``.

    ``seed`` picks the Flan-mini word pools (it must equal the data seed of the runs that use the
    model); ``split`` 0 is for training, 1 for the held-out check; ``families`` a subset of
    ``FOUNDATION_FAMILIES``.
    """
    unknown = sorted(set(families) - set(FOUNDATION_FAMILIES))
    if unknown or not families:
        raise ValueError(f"unknown foundation families {unknown}; known: {FOUNDATION_FAMILIES}")
    units = _Units(word_pools(seed))
    rng = np.random.default_rng([seed, FOUNDATION_TAG, split])
    out = []
    for i in range(n):
        family = families[i % len(families)]
        fields, options, answer = _GENERATORS[family](rng, units)
        wordings = _WORDINGS[family]
        body = wordings[int(rng.integers(len(wordings)))].format(**fields)
        out.append(TextExample(body + "\n" + _options(options), answer, family, family))
    return out
