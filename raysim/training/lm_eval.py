"""Evaluation of a causal LM with its active adapter: teacher-forced loss and greedy generation."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from raysim.training.tasks import CausalLMTask


@torch.no_grad()
def lm_loss(module: torch.nn.Module, encoded: dict[str, np.ndarray], batch_size: int = 16) -> dict:
    """Token-weighted mean cross-entropy on the labelled tokens, and its perplexity."""
    task = CausalLMTask(next(module.parameters()).device)
    data = {k: torch.tensor(np.asarray(v)) for k, v in encoded.items()}
    module.eval()
    total, tokens = 0.0, 0
    for idx in torch.arange(task.num_examples(data)).split(batch_size):
        batch = task.batch(data, idx)
        n = int((batch["labels"][:, 1:] != -100).sum())
        if n:
            total += float(module(**batch).loss) * n
            tokens += n
    loss = total / tokens if tokens else float("nan")
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


@torch.no_grad()
def generate(
    module: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    pad_id: int,
    eos_id: int | None,
    batch_size: int = 16,
) -> list[list[int]]:
    """Greedy decoding (left-padded batches); returns only the new tokens, cut at EOS."""
    device = next(module.parameters()).device
    module.eval()
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(chunk):
            ids[i, width - len(p) :] = torch.as_tensor(p)
            mask[i, width - len(p) :] = 1
        gen = module.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad_id,
            eos_token_id=eos_id,
        )
        for row in gen[:, width:].tolist():
            if eos_id is not None and eos_id in row:
                row = row[: row.index(eos_id)]
            out.append([t for t in row if t != pad_id])
    return out
