"""Prompt encoding for causal-LM training and generation (FedOA spec §4.4, §4.5)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from raysim.data.instructions import TextExample, format_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

IGNORE_INDEX = -100  # label of prompt and padding tokens (FedOA spec §4.4)


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
    """Teacher-forced ``input_ids``/``attention_mask``/``labels``, int64 ``(N, L)``
    (FedOA spec §4.4).

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
    """Generation prompts: BOS + tokens(prompt prefix), no EOS, unpadded (FedOA spec §4.5)."""
    bos = _bos(tokenizer)
    prompts = [format_prompt(e, template) for e in examples]
    return [bos + ids for ids in _token_ids(tokenizer, prompts)]
