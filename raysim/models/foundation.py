"""The tiny "foundation" LLaMA of FedOA spec §7.1, pre-trained once and saved as an HF directory.

Full-parameter training of a config-built tiny LLaMA on the generic instruction corpus of
``raysim.data.foundation_corpus`` (disjoint from the evaluation tasks), so that LoRA clients start
from a fixed, format-aware backbone; without it LoRA on a random network learns almost nothing and
no OOD transfer exists (§7.1). The directory holds the model (safetensors), its word-level
tokenizer and ``raysim_foundation.json`` (settings and held-out accuracy); runs use it as
``model: {name: hf_causal_lm, path: DIR}`` with ``data.text.tokenizer: DIR``.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from raysim.data.flan_mini import generate_flan_mini
from raysim.data.foundation_corpus import (
    FOUNDATION_FAMILIES,
    METADATA_FILE,
    generate_foundation_corpus,
)
from raysim.data.instructions import format_prompt
from raysim.data.lm_encoding import encode_for_training, encode_prompts, pad_id_of
from raysim.data.tokenizer import build_word_tokenizer
from raysim.models.registry import LlamaShape
from raysim.schema import StrictModel


class FoundationConfig(StrictModel):
    """Pre-training settings (FedOA spec §7.1: about 1-2k full-parameter steps, then freeze)."""

    data_seed: int = Field(0, description="Flan-mini word pools; runs must use the same seed")
    init_seed: int = Field(0, description="the weights' init and the batches' order")
    #: ``portable``: the same weights on any x86 CPU (``raysim.util.kernels``; ``raysim
    #: pretrain``'s default); ``native``: this CPU's fastest kernels, the same weights only here
    kernels: Literal["portable", "native"] = "native"
    steps: int = Field(8000, ge=1)  # §7.1 says 1-2k on its slower VM; 8k takes ~5 min here
    batch_size: int = Field(32, ge=1)
    corpus_size: int = Field(40_000, ge=1, description="examples, reshuffled every pass")
    lr: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(100, ge=0)
    weight_decay: float = Field(0.01, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    cutoff_len: int = Field(96, ge=8)
    template: str = "alpaca_short"
    eval_examples: int = Field(500, ge=1)
    #: Corpus families (default: all five of §7.1's examples). Dropping ``option_in_text`` keeps
    #: the reading-comprehension analogue's membership skill out of the base.
    families: list[str] = Field(default_factory=lambda: list(FOUNDATION_FAMILIES))

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(FOUNDATION_FAMILIES))
        if unknown or not value:
            raise ValueError(f"unknown families {unknown}; known: {', '.join(FOUNDATION_FAMILIES)}")
        return value

    shape: LlamaShape = Field(
        default_factory=lambda: LlamaShape(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=128,
        )
    )


def foundation_tokenizer(cfg: FoundationConfig, corpus_texts: list[str]) -> Any:
    """Word-level tokenizer over the corpus and every Flan-mini wording, option and pool word."""
    tasks = generate_flan_mini(cfg.data_seed, 200, 1)
    texts = [
        format_prompt(e, cfg.template) + e.output
        for splits in tasks.values()
        for part in splits.values()
        for e in part
    ]
    return build_word_tokenizer(corpus_texts + texts)


def _schedule(cfg: FoundationConfig) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        rest = max(cfg.steps - cfg.warmup_steps, 1)
        return 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup_steps) / rest))

    return factor


def option_accuracy(model: torch.nn.Module, tokenizer: Any, examples: list, cfg: FoundationConfig):
    """Exact-match accuracy of greedy answers (and the fraction that is one of the options)."""
    from raysim.training.lm_eval import generate

    prompts = encode_prompts(tokenizer, examples, cfg.template)
    outs = generate(model, prompts, 12, pad_id_of(tokenizer), tokenizer.eos_token_id, 64)
    answers = [tokenizer.decode(o, skip_special_tokens=True).strip() for o in outs]
    exact = [a == e.output for a, e in zip(answers, examples, strict=True)]
    listed = [f"\n- {a}\n" in e.instruction + "\n" for a, e in zip(answers, examples, strict=True)]
    return float(np.mean(exact)), float(np.mean(listed))


def pretrain_foundation(
    cfg: FoundationConfig, out: str | Path, progress: Callable[[int, float], None] | None = None
) -> dict[str, Any]:
    """Pre-train the tiny LLaMA, save it to ``out`` and return its metadata.

    ``progress(step, loss)`` is called after every optimiser step.
    """
    from transformers import LlamaForCausalLM

    from raysim.models.causal_lm import llama_config
    from raysim.util.kernels import check_kernels

    kernels = check_kernels(cfg.kernels)
    started = time.perf_counter()
    train = generate_foundation_corpus(cfg.data_seed, cfg.corpus_size, 0, cfg.families)
    held = generate_foundation_corpus(cfg.data_seed, cfg.eval_examples, 1, cfg.families)
    tok = foundation_tokenizer(cfg, [format_prompt(e, cfg.template) + e.output for e in train])
    enc = encode_for_training(tok, train, cfg.template, cfg.cutoff_len)
    data = {k: torch.from_numpy(v) for k, v in enc.items()}
    config = llama_config(cfg.shape, len(tok))
    torch.manual_seed(cfg.init_seed)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(cfg))
    shuffle = torch.Generator().manual_seed(cfg.init_seed)
    batches: list[torch.Tensor] = []
    model.train()
    losses = []
    for step in range(cfg.steps):
        if not batches:  # a new pass over the corpus, freshly shuffled
            batches = list(torch.randperm(len(train), generator=shuffle).split(cfg.batch_size))
            batches.reverse()
        idx = batches.pop()
        mask = data["attention_mask"][idx]
        width = int(mask.sum(1).max())
        batch = {k: v[idx, :width] for k, v in data.items()}
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, losses[-1])
    model.eval()
    exact, listed = option_accuracy(model, tok, held, cfg)
    meta = {
        "config": cfg.model_dump(mode="json"),
        "vocab_size": len(tok),
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_train_loss": float(np.mean(losses[-50:])),
        "heldout_exact_match": exact,
        "heldout_answer_is_an_option": listed,
        "pretrain_seconds": time.perf_counter() - started,
    }
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    meta["weights_sha256"] = weights_digest(tmp)
    meta["machine"] = {**pretraining_machine(), **kernels}
    (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return meta


def foundation_metadata(path: str | Path) -> dict[str, Any] | None:
    """The metadata of a foundation directory, or None if ``path`` is not one."""
    f = Path(path) / METADATA_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def weights_digest(directory: str | Path) -> str:
    """sha256 of a foundation's ``model.safetensors``: which foundation a run used, in one word."""
    import hashlib

    with open(Path(directory) / "model.safetensors", "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def pretraining_machine() -> dict[str, object]:
    """What the weights depend on beyond the config and seeds: the same machine gives the same
    weights bit for bit, but another CPU's kernels (AVX2 or AVX-512, thread count) round floats
    differently, and 8,000 steps carry that into another foundation."""
    import torch

    from raysim.util.machine import cpu_model

    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
