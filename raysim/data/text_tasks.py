"""Instruction-tuning text tasks: synthetic Flan-mini, leave-one-task-out, prompt encoding.

Spec sections: §4.1 (data), §4.2 (protocols), §4.4 (processing), §4.5 (template), §7.1
(synthetic Flan-mini). Everything the runtime receives (``TextTaskDataset``) is numpy and
plain Python, so it pickles into one object-store copy; the tokenizer travels as JSON.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
from pydantic import Field

from raysim.schema import StrictModel

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

Family = Literal["entailment", "sentiment", "paraphrase", "reading_comprehension"]
FAMILIES: tuple[str, ...] = get_args(Family)
TemplateName = Literal["alpaca_short", "alpaca"]
TEXT_TASK_DATASETS = ("flan_mini", "flan")

FLAN_MINI_TAG = 11  # rng = default_rng([seed, FLAN_MINI_TAG, ...]) for the generator
SHARD_TAG = 12  # rng = default_rng([seed, SHARD_TAG, crc32(task)]) for LOTO shards
IGNORE_INDEX = -100  # label of prompt and padding tokens (spec §4.4)

TASK_FAMILY: dict[str, str] = {
    "entail_d1": "entailment",
    "entail_d2": "entailment",
    "senti_d1": "sentiment",
    "senti_d2": "sentiment",
    "para_d1": "paraphrase",
    "para_d2": "paraphrase",
    "rc_d1": "reading_comprehension",
    "rc_d2": "reading_comprehension",
}
FLAN_MINI_TASKS: tuple[str, ...] = tuple(TASK_FAMILY)


@dataclass(frozen=True)
class TextExample:
    """One instruction/answer pair (spec §4.1 line format; ``task`` = sub-dataset id)."""

    instruction: str
    output: str
    task: str
    family: str


# --- prompt template (spec §4.5) --------------------------------------------------------

TEMPLATES: dict[str, str] = {
    "alpaca_short": "### Instruction:\n{instruction}\n\n### Response:\n",
    "alpaca": (
        "Below is an instruction that describes a task. Write a response that appropriately "
        "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
    ),
}


def format_prompt(example_or_instruction: TextExample | str, template: str = "alpaca_short") -> str:
    """The prompt prefix (everything up to and including ``### Response:\\n``), spec §4.5.

    Training text is this prefix + ``output`` + EOS; generation starts right after it.
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {sorted(TEMPLATES)}")
    instruction = (
        example_or_instruction.instruction
        if isinstance(example_or_instruction, TextExample)
        else example_or_instruction
    )
    return TEMPLATES[template].format(instruction=instruction)


# --- synthetic Flan-mini (spec §7.1) -----------------------------------------------------

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
    """Disjoint pseudo-word pools ``{"d1": ..., "d2": ...}`` (CVCV syllables, spec §7.1)."""
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


# --- leave-one-task-out (spec §4.2) ------------------------------------------------------


@dataclass(frozen=True)
class LOTOSplit:
    """Leave-one-task-out clients and test sets (spec §4.2 items 1-3)."""

    held_out: str
    clients: list[list[TextExample]]  # train examples per client
    client_tasks: list[str]  # sub-dataset id per client
    ood_test: list[TextExample]  # held-out family's test examples (all its sub-datasets)
    id_test: list[list[TextExample]]  # each client's own sub-dataset test split


def _task_family(task: str, splits: dict[str, list[TextExample]]) -> str:
    families = {e.family for part in splits.values() for e in part}
    if len(families) > 1:
        raise ValueError(f"sub-dataset {task!r} mixes families {sorted(families)}")
    family = families.pop() if families else TASK_FAMILY.get(task)
    if family not in FAMILIES:
        raise ValueError(f"sub-dataset {task!r} has unknown family {family!r}")
    return family


def leave_one_task_out(
    tasks: dict[str, dict[str, list[TextExample]]],
    held_out: str,
    shards_per_task: int = 1,
    seed: int = 0,
) -> LOTOSplit:
    """Hold out one family; every other sub-dataset becomes 1 client or ``shards_per_task``
    disjoint random near-equal shards (spec §4.2 item 3, shards drawn from ``seed``)."""
    if held_out not in FAMILIES:
        raise ValueError(f"held_out must be one of {list(FAMILIES)}, got {held_out!r}")
    held = {t for t, splits in tasks.items() if _task_family(t, splits) == held_out}
    if not held:
        raise ValueError(f"no sub-dataset of the held-out family {held_out!r} was given")
    return _hold_out(tasks, held, held_out, shards_per_task, seed)


def task_domains(tasks: dict[str, dict[str, list[TextExample]]]) -> dict[str, str]:
    """Sub-dataset → domain label ``d1``, ``d2``, … : its rank among its family's sub-datasets
    (sorted ids; Flan-mini's ``*_d1``/``*_d2``, Flan's e.g. snli/anli)."""
    by_family: dict[str, list[str]] = {}
    for t, splits in tasks.items():
        by_family.setdefault(_task_family(t, splits), []).append(t)
    return {t: f"d{i + 1}" for ts in by_family.values() for i, t in enumerate(sorted(ts))}


def leave_one_domain_out(
    tasks: dict[str, dict[str, list[TextExample]]],
    held_out_domain: str,
    shards_per_task: int = 1,
    seed: int = 0,
) -> LOTOSplit:
    """Hold out one domain of every family (a text analogue of fedoa.md §4.2 item 4): the other
    domain's sub-datasets are the clients, the held-out domain's test splits the OOD set."""
    domains = task_domains(tasks)
    held = {t for t, d in domains.items() if d == held_out_domain}
    if not held:
        raise ValueError(
            f"held_out_domain must be one of {sorted(set(domains.values()))}, "
            f"got {held_out_domain!r}"
        )
    return _hold_out(tasks, held, held_out_domain, shards_per_task, seed)


def _hold_out(
    tasks: dict[str, dict[str, list[TextExample]]],
    held: set[str],
    label: str,
    shards_per_task: int,
    seed: int,
) -> LOTOSplit:
    if shards_per_task < 1:
        raise ValueError(f"shards_per_task must be >= 1, got {shards_per_task}")
    clients, client_tasks, ood, id_test = [], [], [], []
    for task, splits in tasks.items():
        if task in held:
            ood.extend(splits["test"])
            continue
        train = splits["train"]
        if len(train) < shards_per_task:
            raise ValueError(f"{task}: {len(train)} train examples < {shards_per_task} shards")
        rng = np.random.default_rng([seed, SHARD_TAG, zlib.crc32(task.encode())])
        perm = rng.permutation(len(train)) if shards_per_task > 1 else np.arange(len(train))
        for shard in np.array_split(perm, shards_per_task):
            clients.append([train[i] for i in np.sort(shard)])
            client_tasks.append(task)
            id_test.append(list(splits["test"]))
    if not clients:
        raise ValueError("every sub-dataset is held out; no clients remain")
    return LOTOSplit(label, clients, client_tasks, ood, id_test)


def pool_split(split: LOTOSplit) -> LOTOSplit:
    """All training clients merged into one (Centralized, spec §3.1).

    The one client holds every training example (client order kept) and its ID test set is the
    union of the training sub-datasets' test splits, each sub-dataset once (shards share theirs).
    """
    tasks = list(dict.fromkeys(split.client_tasks))
    id_test: list[TextExample] = []
    for task in tasks:
        id_test.extend(split.id_test[split.client_tasks.index(task)])
    pooled = [e for client in split.clients for e in client]
    return LOTOSplit(split.held_out, [pooled], ["+".join(tasks)], split.ood_test, [id_test])


# --- encoding (spec §4.4) ----------------------------------------------------------------


def _token_ids(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _bos(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    return [] if tokenizer.bos_token_id is None else [int(tokenizer.bos_token_id)]


def pad_id_of(tokenizer: PreTrainedTokenizerFast) -> int:
    """The tokenizer's pad id (0 when it has none, as in spec §4.3)."""
    return 0 if tokenizer.pad_token_id is None else int(tokenizer.pad_token_id)


def encode_for_training(
    tokenizer: PreTrainedTokenizerFast,
    examples: Sequence[TextExample],
    template: str = "alpaca_short",
    cutoff_len: int = 512,
    train_on_inputs: bool = False,
) -> dict[str, np.ndarray]:
    """Teacher-forced ``input_ids``/``attention_mask``/``labels``, int64 ``(N, L)`` (spec §4.4).

    Row = BOS + tokens(prompt + output), truncated to ``cutoff_len``, then EOS if there is
    room. Labels are -100 on the prompt (unless ``train_on_inputs``) and on padding. Rows are
    right-padded with the pad id to the longest row (``L <= cutoff_len``).
    """
    if cutoff_len < 1:
        raise ValueError(f"cutoff_len must be >= 1, got {cutoff_len}")
    prompts = [format_prompt(e, template) for e in examples]
    full_ids = _token_ids(tokenizer, [p + e.output for p, e in zip(prompts, examples, strict=True)])
    prompt_ids = _token_ids(tokenizer, prompts)
    bos, eos = _bos(tokenizer), tokenizer.eos_token_id
    rows, n_prompt = [], []
    for full, prompt in zip(full_ids, prompt_ids, strict=True):
        ids = (bos + full)[:cutoff_len]
        if eos is not None and len(ids) < cutoff_len and (not ids or ids[-1] != eos):
            ids.append(int(eos))
        rows.append(ids)
        n_prompt.append(0 if train_on_inputs else min(len(bos) + len(prompt), len(ids)))
    width = max((len(r) for r in rows), default=0)
    input_ids = np.full((len(rows), width), pad_id_of(tokenizer), dtype=np.int64)
    attention = np.zeros((len(rows), width), dtype=np.int64)
    labels = np.full((len(rows), width), IGNORE_INDEX, dtype=np.int64)
    for i, (ids, k) in enumerate(zip(rows, n_prompt, strict=True)):
        input_ids[i, : len(ids)] = ids
        attention[i, : len(ids)] = 1
        labels[i, k : len(ids)] = ids[k:]
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def encode_prompts(
    tokenizer: PreTrainedTokenizerFast,
    examples: Sequence[TextExample],
    template: str = "alpaca_short",
) -> list[list[int]]:
    """Generation prompts: BOS + tokens(prompt prefix), no EOS, unpadded (spec §4.5)."""
    bos = _bos(tokenizer)
    prompts = [format_prompt(e, template) for e in examples]
    return [bos + ids for ids in _token_ids(tokenizer, prompts)]


# --- the dataset the runtime consumes ----------------------------------------------------


@dataclass(eq=False)
class EvalSet:
    """One evaluation set: generation prompts, reference answers and a teacher-forced encoding.

    ``client=None`` marks the shared OOD set; an int marks that client's ID test split.
    """

    prompts: list[list[int]]
    references: list[str]
    encoded: dict[str, np.ndarray]
    client: int | None = None
    tasks: list[str] = field(default_factory=list)  # sub-dataset id per example

    def __len__(self) -> int:
        return len(self.references)


@dataclass(eq=False)
class TextTaskDataset:
    """Encoded leave-one-task-out instruction data (spec §4.2); pickles as numpy + str.

    ``clients[j]`` holds ``input_ids``/``attention_mask``/``labels`` of client ``j``.
    ``eval_sets`` has ``"ood"`` (held-out family, ``client=None``) and, when ID evaluation is
    on, ``"id/<j>"`` (client ``j``'s own sub-dataset test split).
    """

    name: str
    clients: list[dict[str, np.ndarray]]
    client_tasks: list[str]
    eval_sets: dict[str, EvalSet]
    tokenizer_json: str
    special_tokens: dict[str, str | None]
    special_ids: dict[str, int | None]
    vocab_size: int
    held_out: str = ""
    template: str = "alpaca_short"
    input_kind: str = "causal_lm"

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def num_classes(self) -> int:
        """Output classes of the LM head = vocabulary size."""
        return self.vocab_size

    @property
    def max_len(self) -> int:
        """Longest encoded row or generation prompt anywhere in the dataset."""
        widths = [c["input_ids"].shape[1] for c in self.clients]
        for ev in self.eval_sets.values():
            widths.append(ev.encoded["input_ids"].shape[1])
            widths.extend(len(p) for p in ev.prompts)
        return max(widths, default=0)

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return (self.max_len,)

    @property
    def pad_id(self) -> int:
        pad = self.special_ids.get("pad_token")
        return 0 if pad is None else int(pad)

    @property
    def eos_id(self) -> int | None:
        return self.special_ids.get("eos_token")

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("bos_token")

    def client_sizes(self) -> np.ndarray:
        """Number of train examples of every client, int64 ``(num_clients,)``."""
        return np.array([len(c["input_ids"]) for c in self.clients], dtype=np.int64)

    def client_data(self, j: int) -> dict[str, np.ndarray]:
        """Encoded train arrays of client ``j`` (shared, do not modify in place)."""
        if not 0 <= j < self.num_clients:
            raise IndexError(f"client {j} out of range [0, {self.num_clients})")
        return dict(self.clients[j])

    def tokenizer(self) -> PreTrainedTokenizerFast:
        """Rebuild the ``PreTrainedTokenizerFast`` this dataset was encoded with."""
        from raysim.data.tokenizer import tokenizer_from_str

        return tokenizer_from_str(self.tokenizer_json, self.special_tokens)

    def summary(self) -> dict[str, Any]:
        """Sizes and lengths (JSON-friendly)."""
        sizes = self.client_sizes()
        tokens = [int(c["attention_mask"].sum()) for c in self.clients]
        return {
            "name": self.name,
            "input_kind": self.input_kind,
            "held_out": self.held_out,
            "template": self.template,
            "num_clients": self.num_clients,
            "client_tasks": list(self.client_tasks),
            "client_sizes": sizes.tolist(),
            "num_train": int(sizes.sum()),
            "train_tokens": int(sum(tokens)),
            "eval_sets": {k: len(v) for k, v in self.eval_sets.items()},
            "vocab_size": self.vocab_size,
            "max_len": self.max_len,
        }


# --- config and builder ------------------------------------------------------------------


class TextTaskConfig(StrictModel):
    """``data.text``: options of ``data.name in {"flan_mini", "flan"}`` (spec §4.1-4.5, §7.1).

    ``tokenizer="word"`` builds a word-level tokenizer from the train splits of every
    sub-dataset (held-out family included: a stand-in for a foundation tokenizer that knows
    every word); any other value is a local HF tokenizer directory. ``data_dir`` (``flan``
    only) holds one folder per family with ``<name>_train.jsonl``/``<name>_test.jsonl``.
    """

    held_out: Family = "reading_comprehension"
    #: ``task``: leave one task family out (spec §4.2 item 1); ``domain``: leave one domain of
    #: every family out (``held_out_domain``), a text analogue of the vision LODO (item 4).
    protocol: Literal["task", "domain"] = "task"
    held_out_domain: str = "d2"
    n_train: int = Field(60, ge=1)
    n_test: int = Field(20, ge=1)
    #: Seed of the data (Flan-mini words and examples, Flan sampling, shards); None = the run seed.
    #: Fix it to vary only the training randomness across seeds (the papers' data are fixed).
    data_seed: int | None = None
    shards_per_task: int = Field(1, ge=1)
    template: TemplateName = "alpaca_short"
    cutoff_len: int = Field(128, ge=2)
    tokenizer: str = "word"
    data_dir: str | None = None
    cache_dir: str | None = None  # flan: the ``datasets`` cache for the jsonl files
    eval_id: bool = True
    #: Centralized (spec §3.1): merge the training clients into one (needs ``num_clients = 1``);
    #: ``id/0`` is then the union of the training sub-datasets' test splits.
    pool_clients: bool = False

    def check(self, name: str) -> None:
        """Raise ValueError if these options cannot describe dataset ``name``."""
        if name == "flan" and not self.data_dir:
            raise ValueError("data.name='flan' needs data.text.data_dir (the released jsonl)")
        if name == "flan_mini" and (self.data_dir is not None or self.cache_dir is not None):
            raise ValueError("data.text.data_dir/cache_dir only apply to data.name='flan'")


def _eval_set(
    tokenizer: PreTrainedTokenizerFast,
    examples: list[TextExample],
    cfg: TextTaskConfig,
    client: int | None,
) -> EvalSet:
    return EvalSet(
        prompts=encode_prompts(tokenizer, examples, cfg.template),
        references=[e.output for e in examples],
        encoded=encode_for_training(tokenizer, examples, cfg.template, cfg.cutoff_len),
        client=client,
        tasks=[e.task for e in examples],
    )


def _check_foundation_tokenizer(tokenizer: str, data_seed: int) -> None:
    """A tiny-foundation tokenizer only knows the Flan-mini words of its own data seed."""
    from raysim.data.foundation_corpus import METADATA_FILE

    meta = Path(tokenizer) / METADATA_FILE
    if not meta.is_file():
        return
    trained = json.loads(meta.read_text())["config"]["data_seed"]
    if trained != data_seed:
        raise ValueError(
            f"the foundation model at {tokenizer!r} was pre-trained on the Flan-mini words of "
            f"data seed {trained}, but this run generates data with seed {data_seed}; set "
            f"data.text.data_seed={trained} (or pre-train with --data-seed {data_seed})"
        )


def build_text_task_dataset(
    cfg: TextTaskConfig,
    name: str,
    num_clients: int,
    seed: int,
    vocab_size: int | None = None,
) -> TextTaskDataset:
    """Load/generate the sub-datasets, split leave-one-task-out, tokenize and encode."""
    from raysim.data.tokenizer import build_word_tokenizer, load_tokenizer, special_tokens_of

    cfg.check(name)
    seed = seed if cfg.data_seed is None else cfg.data_seed
    if name == "flan_mini":
        _check_foundation_tokenizer(cfg.tokenizer, seed)
        tasks = generate_flan_mini(seed, cfg.n_train, cfg.n_test)
    elif name == "flan":
        from raysim.data.flan import load_flan

        tasks = load_flan(cfg.data_dir or "", seed, cfg.n_train, cfg.n_test, cfg.cache_dir)
    else:
        raise ValueError(f"not a text-task dataset: {name!r}; expected one of {TEXT_TASK_DATASETS}")
    if cfg.protocol == "domain":
        split = leave_one_domain_out(tasks, cfg.held_out_domain, cfg.shards_per_task, seed=seed)
    else:
        split = leave_one_task_out(tasks, cfg.held_out, cfg.shards_per_task, seed=seed)
    if cfg.pool_clients:
        if num_clients != 1:
            raise ValueError(f"data.text.pool_clients=true needs num_clients=1, got {num_clients}")
        split = pool_split(split)
    if num_clients != len(split.clients):
        n_tasks = len(split.clients) // cfg.shards_per_task
        raise ValueError(
            f"leave-one-{cfg.protocol}-out holding out {split.held_out!r} yields "
            f"{len(split.clients)} "
            f"clients ({n_tasks} training sub-datasets x {cfg.shards_per_task} shards), "
            f"but num_clients={num_clients}"
        )
    if cfg.tokenizer == "word":
        texts = [
            format_prompt(e, cfg.template) + e.output
            for splits in tasks.values()
            for e in splits["train"]
        ]
        tok = build_word_tokenizer(texts, vocab_size)
    else:
        tok = load_tokenizer(cfg.tokenizer)
    clients = [encode_for_training(tok, ex, cfg.template, cfg.cutoff_len) for ex in split.clients]
    eval_sets = {"ood": _eval_set(tok, split.ood_test, cfg, None)}
    if cfg.eval_id:
        for j, examples in enumerate(split.id_test):
            eval_sets[f"id/{j}"] = _eval_set(tok, examples, cfg, j)
    specials = special_tokens_of(tok)
    return TextTaskDataset(
        name=name,
        clients=clients,
        client_tasks=split.client_tasks,
        eval_sets=eval_sets,
        tokenizer_json=tok.backend_tokenizer.to_str(),
        special_tokens=specials,
        special_ids={k: getattr(tok, f"{k}_id", None) for k in specials},
        vocab_size=len(tok),
        held_out=cfg.held_out,
        template=cfg.template,
    )
