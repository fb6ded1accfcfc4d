"""Instruction-tuning text tasks: the dataset the runtime consumes, its config and builder.

Spec sections: §4.1 (data), §4.2 (protocols), §4.4 (processing), §4.5 (template), §7.1
(synthetic Flan-mini). Everything the runtime receives (``TextTaskDataset``) is numpy and
plain Python, so it pickles into one object-store copy; the tokenizer travels as JSON.

The top of the text-task layer: it imports the modules below, none of which imports it back.
``instructions`` (``TextExample``, families, template) is the base; ``flan_mini`` (generator and
word pools), ``flan`` (released files), ``loto`` (splits) and ``lm_encoding`` (§4.4 encoders) build
on it; ``foundation_corpus`` builds on ``flan_mini``; ``tokenizer`` stands alone. Their public
names are re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from raysim.data.flan import load_flan
from raysim.data.flan_mini import _OPTIONS, FLAN_MINI_TAG, WordPool, generate_flan_mini, word_pools
from raysim.data.foundation_corpus import METADATA_FILE
from raysim.data.instructions import (
    FAMILIES,
    FLAN_MINI_TASKS,
    TASK_FAMILY,
    TEMPLATES,
    Family,
    TemplateName,
    TextExample,
    format_prompt,
)
from raysim.data.lm_encoding import IGNORE_INDEX, encode_for_training, encode_prompts, pad_id_of
from raysim.data.loto import (
    SHARD_TAG,
    LOTOSplit,
    leave_one_domain_out,
    leave_one_task_out,
    pool_split,
    task_domains,
)
from raysim.data.tokenizer import (
    build_word_tokenizer,
    load_tokenizer,
    special_tokens_of,
    tokenizer_from_str,
)
from raysim.schema import StrictModel

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "FAMILIES",
    "FLAN_MINI_TAG",
    "FLAN_MINI_TASKS",
    "IGNORE_INDEX",
    "SHARD_TAG",
    "TASK_FAMILY",
    "TEMPLATES",
    "TEXT_TASK_DATASETS",
    "_OPTIONS",
    "EvalSet",
    "Family",
    "LOTOSplit",
    "TemplateName",
    "TextExample",
    "TextTaskConfig",
    "TextTaskDataset",
    "WordPool",
    "build_text_task_dataset",
    "encode_for_training",
    "encode_prompts",
    "format_prompt",
    "generate_flan_mini",
    "leave_one_domain_out",
    "leave_one_task_out",
    "pad_id_of",
    "pool_split",
    "task_domains",
    "word_pools",
]

TEXT_TASK_DATASETS = ("flan_mini", "flan")

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
    """Encoded leave-one-task-out instruction data (FedOA spec §4.2); pickles as numpy + str.

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
    """``data.text``: options of ``data.name in {"flan_mini", "flan"}`` (FedOA spec §4.1-4.5, §7.1).

    ``tokenizer="word"`` builds a word-level tokenizer from the train splits of every
    sub-dataset (held-out family included: a stand-in for a foundation tokenizer that knows
    every word); any other value is a local HF tokenizer directory. ``data_dir`` (``flan``
    only) holds one folder per family with ``<name>_train.jsonl``/``<name>_test.jsonl``.
    """

    held_out: Family = Field(
        "reading_comprehension",
        description="protocol task: the task family held out as the unseen (OOD) task",
    )
    protocol: Literal["task", "domain"] = Field(
        "task",
        description="task: leave one task family out (FedOA spec §4.2 item 1); domain: leave "
        "one domain of every family out (held_out_domain), a text analogue of the vision "
        "leave-one-domain-out (item 4)",
    )
    held_out_domain: str = Field(
        "d2",
        description="protocol domain: the domain held out (d1, d2: a sub-dataset's rank within "
        "its family)",
    )
    n_train: int = Field(60, ge=1, description="training examples per sub-dataset")
    n_test: int = Field(20, ge=1, description="test examples per sub-dataset")
    data_seed: int | None = Field(
        None,
        description="the seed of the data (Flan-mini's words and examples, Flan's sampling, the "
        "shards); None: the run seed. Fix it to vary only the training randomness across seeds",
    )
    shards_per_task: int = Field(
        1, ge=1, description="clients per training sub-dataset (disjoint random shards)"
    )
    template: TemplateName = Field(
        "alpaca_short", description="the prompt template (FedOA spec §4.5)"
    )
    cutoff_len: int = Field(
        128, ge=2, description="tokens per example at most (prompt and answer, truncated)"
    )
    tokenizer: str = Field(
        "word",
        description="word: a word-level tokenizer built from every sub-dataset's train split; "
        "else a local Hugging Face tokenizer folder, or smollm2",
    )
    data_dir: str | None = Field(
        None,
        description="flan: the folder of the released files, one folder per family with "
        "<name>_train.jsonl and <name>_test.jsonl",
    )
    cache_dir: str | None = Field(None, description="flan: the datasets cache for the jsonl files")
    eval_id: bool = Field(
        True, description="also evaluate each client on its own sub-dataset's test split"
    )
    pool_clients: bool = Field(
        False,
        description="Centralized (FedOA spec §3.1): merge the training clients into one (needs "
        "clients.num 1); its own test set is then the training sub-datasets' test splits",
    )

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
    cfg.check(name)
    seed = seed if cfg.data_seed is None else cfg.data_seed
    if name == "flan_mini":
        _check_foundation_tokenizer(cfg.tokenizer, seed)
        tasks = generate_flan_mini(seed, cfg.n_train, cfg.n_test)
    elif name == "flan":
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
