"""Name → model builder registry; later issues add LLM and vision builders here."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field

from raysim.models.handle import ModelHandle
from raysim.models.layout import DEFAULT_GROUPS, ParamGroup
from raysim.schema import StrictModel


@dataclass(frozen=True)
class DataSpec:
    """What a model builder needs to know about the data."""

    input_kind: str  # "dense" or "tokens"
    feature_shape: tuple[int, ...]
    num_classes: int
    vocab_size: int | None = None
    pad_id: int = 0  # the padding token of token inputs


class LlamaShape(StrictModel):
    """A LLaMA architecture built from a config (random init); ``vocab_size`` None = tokenizer's."""

    vocab_size: int | None = None
    hidden_size: int = Field(64, ge=8)
    intermediate_size: int = Field(128, ge=8)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(4, ge=1)
    max_position_embeddings: int = Field(512, ge=8)
    rms_norm_eps: float = 1e-6


class LoraSettings(StrictModel):
    """PEFT LoRA on the frozen base (fedoa.md §4.3 defaults: r 8, α 16, dropout 0.05, q/v)."""

    r: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    targets: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"])


class ImageSettings(StrictModel):
    """How inputs reach a vision model (feddle.md §5.1)."""

    size: int | None = Field(
        224, ge=8, description="resize inputs to size×size (bilinear); None keeps their size"
    )
    channels: int = Field(3, ge=1, description="grayscale inputs are replicated to this many")
    normalize: Literal["auto", "imagenet", "none"] = Field(
        "auto", description="ImageNet mean/std; auto = only for pretrained weights (model.path)"
    )


class ResNetShape(StrictModel):
    """``transformers.ResNetConfig`` fields; the defaults are ResNet18."""

    depths: list[int] = Field(default_factory=lambda: [2, 2, 2, 2])
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 128, 256, 512])
    embedding_size: int = Field(64, ge=1)
    layer_type: Literal["basic", "bottleneck"] = "basic"


class ViTShape(StrictModel):
    """``transformers.ViTConfig`` fields; the defaults are ViT-B/16."""

    patch_size: int = Field(16, ge=1)
    hidden_size: int = Field(768, ge=8)
    num_hidden_layers: int = Field(12, ge=1)
    num_attention_heads: int = Field(12, ge=1)
    intermediate_size: int = Field(3072, ge=8)


class TransformerLMShape(StrictModel):
    """``transformer_lm`` (PyTorch's word_language_model Transformer: sinusoidal positions, a
    causal encoder, an untied decoder); d_model is ``embed_dim``, dropout ``dropout``."""

    layers: int = Field(2, ge=1)
    heads: int = Field(2, ge=1)
    ffn: int = Field(128, ge=1, description="the feed-forward width")


class ModelConfig(StrictModel):
    """Which model to build; unused fields are ignored by builders that do not need them."""

    name: str = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [128])
    channels: list[int] = Field(default_factory=lambda: [16, 32])
    embed_dim: int = Field(64, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    batch_norm: bool = Field(False, description="cnn: BatchNorm after every convolution")
    # causal LMs (llama, hf_causal_lm, smollm2)
    path: str | None = Field(
        None, description="HF model id or local directory (hf_causal_lm; resnet/vit_lora weights)"
    )
    llama: LlamaShape = Field(default_factory=LlamaShape)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    # vision models (resnet, vit_lora; feddle.md §5.1)
    image: ImageSettings = Field(default_factory=ImageSettings)
    resnet: ResNetShape = Field(default_factory=ResNetShape)
    vit: ViTShape = Field(default_factory=ViTShape)
    # next-token models on pre-tokenized sequences (fedbaf.md §4.1, §8.1)
    transformer: TransformerLMShape = Field(default_factory=TransformerLMShape)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("auto", description="auto (cuda if visible, else cpu), cpu, cuda")


Builder = Callable[[ModelConfig, DataSpec], torch.nn.Module]
#: A method's model wrapper: (built module, data spec, the method's params) -> the module
#: clients train (``Method.wrap_model``).
ModelWrapper = Callable[[torch.nn.Module, "DataSpec", Any], torch.nn.Module]
_BUILDERS: dict[str, Builder] = {}
_TRAITS: dict[str, frozenset[str]] = {}


def register_model(name: str, traits: Iterable[str] = ()) -> Callable[[Builder], Builder]:
    """Register a builder under ``name`` with the traits methods may need (``Method.needs``):
    ``classifier`` (labelled inputs → class logits, a last ``nn.Linear`` head), ``image``,
    ``causal_lm`` (an HF causal LM on tokenised text), ``lora`` (its parameter groups are LoRA
    adapters on a frozen base), ``token_lm`` (next-token prediction on pre-tokenised
    sequences)."""

    def wrap(fn: Builder) -> Builder:
        _BUILDERS[name] = fn
        _TRAITS[name] = frozenset(traits)
        return fn

    return wrap


def model_traits(name: str) -> frozenset[str]:
    """The traits ``name`` was registered with (none for an unknown model)."""
    return _TRAITS.get(name, frozenset())


def model_names() -> list[str]:
    """Registered model names (the built-in ones register when ``raysim.models`` is imported)."""
    return sorted(_BUILDERS)


def build_handle(
    cfg: ModelConfig,
    spec: DataSpec,
    groups: Sequence[ParamGroup] = DEFAULT_GROUPS,
    wrap: Callable[[torch.nn.Module, DataSpec], torch.nn.Module] | None = None,
) -> ModelHandle:
    """Build the resident model as a ``ModelHandle`` with the method's parameter ``groups``.

    On a causal LM each group is a LoRA adapter; on a plain module groups select tensors by name,
    after ``wrap`` (a method's wrapper, e.g. an input map in front of the model) is applied.
    """
    built = build_model(cfg, spec, groups)
    if isinstance(built, ModelHandle):
        if wrap is not None:
            raise ValueError(f"model {cfg.name!r} is a LoRA model; the method cannot wrap it")
        return built
    if wrap is not None:
        built = wrap(built, spec)
    return ModelHandle(built, groups)


def build_model(
    cfg: ModelConfig, spec: DataSpec, groups: Sequence[ParamGroup] = DEFAULT_GROUPS
) -> torch.nn.Module | ModelHandle:
    """Build a freshly initialised model (initialisation follows torch's global RNG)."""
    names = model_names()
    if cfg.name not in _BUILDERS:
        close = difflib.get_close_matches(cfg.name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown model {cfg.name!r}{hint}; known: {', '.join(names)}")
    builder = _BUILDERS[cfg.name]
    if getattr(builder, "takes_groups", False):
        return builder(cfg, spec, groups)
    return builder(cfg, spec)
