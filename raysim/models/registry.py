"""Name → model builder registry, and the model config.

This module loads without torch, so a config can be checked (``model_names``, ``model_traits``)
before any process imports it: the built-in models are listed below with their traits, and a
built-in's module (which imports torch) is imported only when that model is built.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from raysim.models.layout import DEFAULT_GROUPS, ParamGroup
from raysim.schema import StrictModel

if TYPE_CHECKING:
    import torch

    from raysim.models.handle import ModelHandle


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

    vocab_size: int | None = Field(
        None, description="embedding rows; None: the tokenizer's vocabulary"
    )
    hidden_size: int = Field(64, ge=8, description="the model width d")
    intermediate_size: int = Field(128, ge=8, description="the MLP's inner width")
    num_hidden_layers: int = Field(2, ge=1, description="decoder layers")
    num_attention_heads: int = Field(4, ge=1, description="attention heads (they divide d)")
    num_key_value_heads: int = Field(
        4, ge=1, description="key/value heads; fewer than the attention heads: grouped queries"
    )
    max_position_embeddings: int = Field(512, ge=8, description="the longest sequence, in tokens")
    rms_norm_eps: float = Field(1e-6, description="ε of RMSNorm")


class LoraSettings(StrictModel):
    """PEFT LoRA on the frozen base (FedOA spec §4.3 defaults: r 8, α 16, dropout 0.05, q/v)."""

    r: int = Field(8, ge=1, description="the adapters' rank")
    alpha: float = Field(16.0, gt=0, description="the LoRA scaling numerator: updates scale by α/r")
    dropout: float = Field(0.05, ge=0, lt=1, description="dropout on the adapters' input")
    targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        description="names of the modules that get adapters (PEFT's target_modules)",
    )
    adapter_dtype: Literal["float32", "model"] = Field(
        "float32",
        description="float32: PEFT's default, adapters in float32 on a lower-precision base; "
        "model: adapters in the base's dtype (model.dtype), so that a bf16 model's trained "
        "tensors, and what the server mixes into them, are bf16 end to end (FedBaF spec §7.2 "
        "invariant 14)",
    )


class ImageSettings(StrictModel):
    """How inputs reach a vision model (Feddle spec §5.1)."""

    size: int | None = Field(
        224, ge=8, description="resize inputs to size×size (bilinear); None keeps their size"
    )
    channels: int = Field(3, ge=1, description="grayscale inputs are replicated to this many")
    normalize: Literal["auto", "imagenet", "none"] = Field(
        "auto", description="ImageNet mean/std; auto = only for pretrained weights (model.path)"
    )


class ResNetShape(StrictModel):
    """``transformers.ResNetConfig`` fields; the defaults are ResNet18."""

    depths: list[int] = Field(
        default_factory=lambda: [2, 2, 2, 2], description="blocks per stage (resnet, preact_resnet)"
    )
    hidden_sizes: list[int] = Field(
        default_factory=lambda: [64, 128, 256, 512],
        description="channels per stage (resnet, preact_resnet)",
    )
    embedding_size: int = Field(64, ge=1, description="resnet: channels of the stem convolution")
    layer_type: Literal["basic", "bottleneck"] = Field(
        "basic", description="resnet: basic (ResNet18/34) or bottleneck (ResNet50 and up) blocks"
    )


class ViTShape(StrictModel):
    """``transformers.ViTConfig`` fields; the defaults are ViT-B/16."""

    patch_size: int = Field(16, ge=1, description="side of a square patch, in pixels")
    hidden_size: int = Field(768, ge=8, description="the model width")
    num_hidden_layers: int = Field(12, ge=1, description="encoder layers")
    num_attention_heads: int = Field(12, ge=1, description="attention heads per layer")
    intermediate_size: int = Field(3072, ge=8, description="the MLP's inner width")


class TransformerLMShape(StrictModel):
    """``transformer_lm`` (PyTorch's word_language_model Transformer: sinusoidal positions, a
    causal encoder, an untied decoder); d_model is ``embed_dim``, dropout ``dropout``."""

    layers: int = Field(2, ge=1, description="encoder layers")
    heads: int = Field(2, ge=1, description="attention heads (they divide model.embed_dim)")
    ffn: int = Field(128, ge=1, description="the feed-forward width")


class ModelConfig(StrictModel):
    """Which model to build; unused fields are ignored by builders that do not need them."""

    name: str = Field(
        "mlp", description="the model (a plugin may register more; algorithm.module loads it)"
    )
    hidden: list[int] = Field(
        default_factory=lambda: [128],
        description="widths of the hidden layers of mlp, and of the head of cnn and "
        "bag_of_embeddings",
    )
    channels: list[int] = Field(
        default_factory=lambda: [16, 32], description="cnn: output channels of each convolution"
    )
    embed_dim: int = Field(
        64, ge=1, description="bag_of_embeddings: embedding width; transformer_lm: d_model"
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="dropout probability after each hidden layer of mlp and cnn's head, and in "
        "transformer_lm",
    )
    batch_norm: bool = Field(False, description="cnn: BatchNorm after every convolution")
    # causal LMs (llama, hf_causal_lm, smollm2)
    path: str | None = Field(
        None, description="HF model id or local directory (hf_causal_lm; resnet/vit_lora weights)"
    )
    llama: LlamaShape = Field(
        default_factory=LlamaShape,
        description="llama, and lm_classifier without model.path: the LLaMA built at random",
    )
    lora: LoraSettings = Field(
        default_factory=LoraSettings,
        description="the LoRA adapters of llama, hf_causal_lm, smollm2 and lm_classifier; vit_lora "
        "where set (else r 4, α 8 on query and value)",
    )
    # vision models (resnet, vit_lora; Feddle spec §5.1)
    image: ImageSettings = Field(
        default_factory=ImageSettings,
        description="how inputs reach resnet, preact_resnet, vit and vit_lora",
    )
    resnet: ResNetShape = Field(
        default_factory=ResNetShape,
        description="resnet's and preact_resnet's shape without model.path (ResNet18)",
    )
    vit: ViTShape = Field(
        default_factory=ViTShape, description="vit's and vit_lora's shape without model.path"
    )
    # next-token models on pre-tokenized sequences (FedBaF spec §4.1, §8.1)
    transformer: TransformerLMShape = Field(
        default_factory=TransformerLMShape, description="transformer_lm's layers and heads"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="the weights' dtype of llama, hf_causal_lm and smollm2 (other models: float32)",
    )
    device: str = Field("auto", description="auto (cuda if visible, else cpu), cpu, cuda")


Builder = Callable[[ModelConfig, DataSpec], "torch.nn.Module"]
#: A method's model wrapper: (built module, data spec, the method's params) -> the module
#: clients train (``Method.wrap_model``).
ModelWrapper = Callable[["torch.nn.Module", "DataSpec", Any], "torch.nn.Module"]

#: The built-in models: name → (the module that registers its builder, its traits). Traits are
#: what methods may need (``Method.needs``): ``classifier`` (labelled inputs → class logits, a
#: last ``nn.Linear`` head), ``image``, ``causal_lm`` (an HF causal LM on tokenised text),
#: ``lora`` (its parameter groups are LoRA adapters on a frozen base), ``token_lm`` (next-token
#: prediction on pre-tokenised sequences), ``token_embeddings``.
BUILTIN_MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mlp": ("raysim.models.small", ("classifier",)),
    "cnn": ("raysim.models.small", ("classifier",)),
    "bag_of_embeddings": ("raysim.models.small", ("classifier",)),
    "transformer_lm": ("raysim.models.small", ("token_lm",)),
    "llama": ("raysim.models.causal_lm", ("causal_lm", "lora")),
    "hf_causal_lm": ("raysim.models.causal_lm", ("causal_lm", "lora")),
    "smollm2": ("raysim.models.causal_lm", ("causal_lm", "lora")),
    "lm_classifier": ("raysim.models.lm_classifier", ("classifier", "token_embeddings")),
    "alexnet": ("raysim.models.tf_nets", ("classifier", "image")),
    "mini_inception": ("raysim.models.tf_nets", ("classifier", "image")),
    "resnet": ("raysim.models.vision", ("classifier", "image")),
    "preact_resnet": ("raysim.models.vision", ("classifier", "image")),
    "vit": ("raysim.models.vision", ("classifier", "image")),
    "vit_lora": ("raysim.models.vision", ("classifier", "image")),
}
_BUILDERS: dict[str, Builder] = {}
_TRAITS: dict[str, frozenset[str]] = {n: frozenset(t) for n, (_, t) in BUILTIN_MODELS.items()}


def register_model(name: str, traits: Iterable[str] = ()) -> Callable[[Builder], Builder]:
    """Register a builder under ``name`` with the traits methods may need (see
    ``BUILTIN_MODELS``). A built-in model's traits are the ones listed there."""

    def wrap(fn: Builder) -> Builder:
        builtin = BUILTIN_MODELS.get(name)
        if builtin is not None and fn.__module__ != builtin[0]:
            raise ValueError(f"model {name!r} is built in ({builtin[0]}); choose another name")
        _BUILDERS[name] = fn
        if builtin is None:
            _TRAITS[name] = frozenset(traits)
        return fn

    return wrap


def model_traits(name: str) -> frozenset[str]:
    """The traits of model ``name`` (none for an unknown model)."""
    return _TRAITS.get(name, frozenset())


def model_names() -> list[str]:
    """The built-in models and those a plugin registered."""
    return sorted(set(BUILTIN_MODELS) | set(_BUILDERS))


def _builder(name: str) -> Builder | None:
    if name not in _BUILDERS and name in BUILTIN_MODELS:
        importlib.import_module(BUILTIN_MODELS[name][0])
    return _BUILDERS.get(name)


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
    from raysim.models.handle import ModelHandle

    built = build_model(cfg, spec, groups)
    if isinstance(built, ModelHandle):
        if wrap is not None:
            raise ValueError(f"model {cfg.name!r} is a LoRA model; the method cannot wrap it")
        return built
    if wrap is not None:
        built = wrap(built, spec)
    # ``model.device``: a causal LM is built there; any other module (and what the method
    # wrapped around it) is built on the CPU, under the run's init stream, and moved
    return ModelHandle(built.to(resolve_device(cfg.device)), groups)


def resolve_device(name: str) -> torch.device:
    """``model.device``: ``auto`` is CUDA where this process sees a GPU (a worker with
    ``workers.num_gpus``), else the CPU."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_model(
    cfg: ModelConfig, spec: DataSpec, groups: Sequence[ParamGroup] = DEFAULT_GROUPS
) -> torch.nn.Module | ModelHandle:
    """Build a freshly initialised model (initialisation follows torch's global RNG)."""
    builder = _builder(cfg.name)
    if builder is None:
        names = model_names()
        close = difflib.get_close_matches(cfg.name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown model {cfg.name!r}{hint}; known: {', '.join(names)}")
    if getattr(builder, "takes_groups", False):
        return builder(cfg, spec, groups)
    return builder(cfg, spec)
