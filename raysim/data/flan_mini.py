"""Synthetic Flan-mini (FedOA spec §7.1): eight sub-datasets over seeded pseudo-word pools.

Also the shared vocabulary other corpora reuse: ``word_pools`` (the content words of both
domains) and ``_OPTIONS`` (the label words and phrases of every sub-dataset).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from raysim.data.instructions import FLAN_MINI_TASKS, TASK_FAMILY, TEMPLATES, TextExample

FLAN_MINI_TAG = 11  # rng = default_rng([seed, FLAN_MINI_TAG, ...]) for the generator

_OPTIONS: dict[str, tuple[str, ...]] = {
    "entail_d1": ("yes", "it is not possible to tell", "no"),
    "entail_d2": ("Yes", "It's impossible to say", "No"),
    "senti_d1": ("negative", "positive"),
    "senti_d2": ("negative", "positive"),
    "para_d1": ("no", "yes"),
    "para_d2": ("0", "1", "2", "3", "4", "5"),
}
# Two wordings per sub-dataset; {a}/{b} are the generated contents, the OPTIONS list follows.
_WORDINGS: dict[str, tuple[str, ...]] = {
    "entail_d1": (
        "Premise: {a}\nHypothesis: {b}\nDoes the premise entail the hypothesis?",
        "Premise: {a}\nHypothesis: {b}\nIs the hypothesis true given the premise?",
    ),
    "entail_d2": (
        "Read the text and decide if the claim follows.\nText: {a}\nClaim: {b}",
        '{a}\nCan we conclude that the claim "{b}" holds?',
    ),
    "senti_d1": (
        "Review: {a}\nIs this movie review negative or positive?",
        "Review: {a}\nWhat is the sentiment of this review?",
    ),
    "senti_d2": (
        "Tweet: {a}\nHow would you describe the sentiment of this tweet?",
        "{a}\nWhat is the mood of the tweet above?",
    ),
    "para_d1": (
        "Sentence 1: {a}\nSentence 2: {b}\nDo these two sentences mean the same thing?",
        "First sentence: {a}\nSecond sentence: {b}\nAre the sentences paraphrases?",
    ),
    "para_d2": (
        "Headline 1: {a}\nHeadline 2: {b}\nHow similar are the headlines on a scale of 0 to 5?",
        "{a}\n{b}\nRate the similarity of these two lines from 0 to 5.",
    ),
    "rc_d1": (
        "Fact: {a}\nQuestion: what is {b}?",
        "Read the facts and answer the question.\n{a}\n{b} is what?",
    ),
    "rc_d2": (
        "Passage: {a}\nWhich name appears twice in the passage?",
        "{a}\nFind the entity that is mentioned two times.",
    ),
}
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_FINAL_VOWELS = "aiou"  # no final "e": the Porter stemmer (ROUGE, §4.6) leaves these intact
_POOL_SIZES = {"nouns": 40, "positive": 6, "negative": 6}
_MAX_TRIES_PER_EXAMPLE = 50


def _reserved_words() -> frozenset[str]:
    texts = [*TEMPLATES.values(), "OPTIONS"]
    texts += [w for ws in _WORDINGS.values() for w in ws]
    texts += [o for os_ in _OPTIONS.values() for o in os_]
    return frozenset(w.lower() for t in texts for w in re.findall(r"[A-Za-z]+", t))


@dataclass(frozen=True)
class WordPool:
    """A domain's pseudo-word pool: content nouns plus a positive and a negative lexicon."""

    nouns: tuple[str, ...]
    positive: tuple[str, ...]
    negative: tuple[str, ...]

    def words(self) -> frozenset[str]:
        return frozenset(self.nouns + self.positive + self.negative)


def word_pools(seed: int) -> dict[str, WordPool]:
    """Disjoint pseudo-word pools ``{"d1": ..., "d2": ...}`` (CVCV syllables, FedOA spec §7.1)."""
    c, v, f = _CONSONANTS, _VOWELS, _FINAL_VOWELS
    reserved = _reserved_words()
    candidates = [a + b + x + y for a in c for b in v for x in c for y in f]
    candidates = [w for w in candidates if w not in reserved]
    order = np.random.default_rng([seed, FLAN_MINI_TAG, 0]).permutation(len(candidates))
    it = iter(candidates[i] for i in order)
    pools = {}
    for domain in ("d1", "d2"):
        parts = {k: tuple(next(it) for _ in range(n)) for k, n in _POOL_SIZES.items()}
        pools[domain] = WordPool(**parts)
    return pools


def _options(options: Sequence[str]) -> str:
    return "OPTIONS:\n" + "\n".join(f"- {o}" for o in options)


def _pick(rng: np.random.Generator, words: Sequence[str], k: int) -> list[str]:
    return [words[i] for i in rng.choice(len(words), size=k, replace=False)]


def _shuffled(rng: np.random.Generator, words: Sequence[str]) -> list[str]:
    return [words[i] for i in rng.permutation(len(words))]


def _sentence(words: Sequence[str]) -> str:
    return " ".join(words) + "."


def _entail(rng: np.random.Generator, pool: WordPool, n_premise: int, n_hyp: int) -> tuple:
    """Answer index 0 = every hypothesis word in the premise, 2 = none, 1 = some."""
    label = int(rng.integers(3))
    words = _pick(rng, pool.nouns, n_premise + n_hyp)
    premise, outside = words[:n_premise], words[n_premise:]
    if label == 0:
        hyp = _pick(rng, premise, n_hyp)
    elif label == 2:
        hyp = outside
    else:
        k = int(rng.integers(1, n_hyp))
        hyp = _shuffled(rng, _pick(rng, premise, k) + outside[: n_hyp - k])
    return premise, hyp, label


def _gen_entail_d1(rng: np.random.Generator, pool: WordPool) -> tuple[str, str, int]:
    premise, hyp, label = _entail(rng, pool, 5, 2)
    return _sentence(premise), " ".join(hyp), label


def _gen_entail_d2(rng: np.random.Generator, pool: WordPool) -> tuple[str, str, int]:
    premise, hyp, label = _entail(rng, pool, 8, 3)
    return _sentence(premise[:4]) + " " + _sentence(premise[4:]), " ".join(hyp), label


def _sentiment(rng: np.random.Generator, pool: WordPool, n_sent: int, n_plain: int) -> tuple:
    """Answer index 1 (positive) iff positive lexicon words are the majority."""
    label = int(rng.integers(2))
    majority = n_sent // 2 + 1
    n_pos = int(rng.integers(majority, n_sent + 1)) if label else int(rng.integers(0, majority))
    words = _pick(rng, pool.positive, n_pos) + _pick(rng, pool.negative, n_sent - n_pos)
    return _shuffled(rng, words + _pick(rng, pool.nouns, n_plain)), label


def _gen_senti_d1(rng: np.random.Generator, pool: WordPool) -> tuple[str, str, int]:
    words, label = _sentiment(rng, pool, 3, 3)
    return _sentence(words), "", label


def _gen_senti_d2(rng: np.random.Generator, pool: WordPool) -> tuple[str, str, int]:
    words, label = _sentiment(rng, pool, 3, 1)
    user, tag = _pick(rng, pool.nouns, 2)
    return f"@{user} {' '.join(words)} #{tag}", "", label


def _gen_para_d1(rng: np.random.Generator, pool: WordPool) -> tuple[str, str, int]:
    """Answer ``yes`` (index 1) iff the second sentence is a permutation of the first."""
    words = _pick(rng, pool.nouns, 6)
    first, spare = words[:5], words[5]
    label = int(rng.integers(2))
    second = list(first)
    if not label:
        second[int(rng.integers(5))] = spare
    return _sentence(first), _sentence(_shuffled(rng, second)), label


def _gen_para_d2(rng: np.random.Generator, pool: WordPool) -> tuple[str, str, int]:
    """Similarity 0-5 = number of shared words between two 5-word headlines."""
    k = int(rng.integers(6))
    words = _pick(rng, pool.nouns, 10 - k)
    first = words[:5]
    second = _shuffled(rng, _pick(rng, first, k) + words[5:])
    return " ".join(first), " ".join(second), k


def _gen_rc_d1(rng: np.random.Generator, pool: WordPool) -> tuple[str, str, list[str], str]:
    """Facts "wA is wB. wC is wD."; question about wA; 4 options; answer wB."""
    a, b, c, d, e, f = _pick(rng, pool.nouns, 6)
    facts = [f"{a} is {b}.", f"{c} is {d}."]
    return " ".join(_shuffled(rng, facts)), a, _shuffled(rng, [b, d, e, f]), b


def _gen_rc_d2(rng: np.random.Generator, pool: WordPool) -> tuple[str, str, list[str], str]:
    """Six mentions of five entities; which one occurs twice; 6 sorted options."""
    names = _pick(rng, pool.nouns, 6)
    present, twice = names[:5], names[0]
    passage = _sentence(_shuffled(rng, [*present, twice]))
    return passage, "", sorted(names), twice


_GENERATORS: dict[str, Callable[[np.random.Generator, WordPool], tuple]] = {
    "entail_d1": _gen_entail_d1,
    "entail_d2": _gen_entail_d2,
    "senti_d1": _gen_senti_d1,
    "senti_d2": _gen_senti_d2,
    "para_d1": _gen_para_d1,
    "para_d2": _gen_para_d2,
    "rc_d1": _gen_rc_d1,
    "rc_d2": _gen_rc_d2,
}


def _example(task: str, rng: np.random.Generator, pool: WordPool) -> TextExample:
    out = _GENERATORS[task](rng, pool)
    if task.startswith("rc_"):
        a, b, options, answer = out
    else:
        a, b, label = out
        options = list(_OPTIONS[task])
        answer = options[label]
    wordings = _WORDINGS[task]
    body = wordings[int(rng.integers(len(wordings)))].format(a=a, b=b)
    return TextExample(body + "\n" + _options(options), answer, task, TASK_FAMILY[task])


def _unique_examples(
    task: str, rng: np.random.Generator, pool: WordPool, n: int, exclude: set[str]
) -> list[TextExample]:
    seen, out = set(exclude), []
    for _ in range(_MAX_TRIES_PER_EXAMPLE * n + 100):
        if len(out) == n:
            return out
        ex = _example(task, rng, pool)
        if ex.instruction not in seen:
            seen.add(ex.instruction)
            out.append(ex)
    if len(out) == n:
        return out
    raise RuntimeError(f"{task}: could not draw {n} distinct examples")


def generate_flan_mini(
    seed: int, n_train: int, n_test: int
) -> dict[str, dict[str, list[TextExample]]]:
    """The 8 synthetic sub-datasets of spec §7.1: ``{task: {"train": [...], "test": [...]}}``.

    Deterministic in ``seed``; every split is drawn from its own stream, instructions are
    distinct within a sub-dataset and test never repeats a train instruction.
    """
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train and n_test must be >= 1, got {n_train} and {n_test}")
    pools = word_pools(seed)
    tasks: dict[str, dict[str, list[TextExample]]] = {}
    for i, task in enumerate(FLAN_MINI_TASKS):
        pool = pools[task.rsplit("_", 1)[1]]
        train_rng = np.random.default_rng([seed, FLAN_MINI_TAG, 1 + i, 0])
        test_rng = np.random.default_rng([seed, FLAN_MINI_TAG, 1 + i, 1])
        train = _unique_examples(task, train_rng, pool, n_train, set())
        test = _unique_examples(task, test_rng, pool, n_test, {e.instruction for e in train})
        tasks[task] = {"train": train, "test": test}
    return tasks
