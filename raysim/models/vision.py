"""Vision models of Feddle spec §5.1, built from ``transformers`` configs (no download):

- ``resnet``: ResNet18 by default (``ResNetForImageClassification``), every tensor trained;
- ``vit_lora``: ViT-B/16 by default (``ViTForImageClassification``) with PEFT LoRA on the
  attention query and value projections plus a trainable classifier; the rest is frozen;
- the spec's CNN is ``cnn`` with ``channels: [32, 64, 64]``, ``hidden: [128]`` (``small.py``).

Random initialisation follows torch's global RNG; ``model.path`` (a local directory or a hub id
already in the cache) loads pretrained weights with a new classifier for the run's classes.

Each model sits behind ``ImageInput``, which reshapes flat square inputs, replicates grayscale to
three channels, resizes to ``image.size`` and normalises (§5.1), so a dataset is stored at its own
resolution and a 224×224 copy is never kept. The head is the last ``nn.Linear`` (the classifier)
and its input is the body's features: ResNet's 512-d pooled output, ViT's 768-d pre-logits CLS
token (§3.5), which is the body/head split Feddle-OOD uses (``algorithms/feddle/probe.head_of``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from raysim.models.registry import DataSpec, ImageSettings, ModelConfig, register_model

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: Feddle spec §5.1: LoRA rank 4, "adaptation scale" 8 (lora_alpha 8), dropout 0, on the attention
#: query and value projections (``q_proj``/``v_proj`` in transformers 5)
VIT_LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "targets": ["q_proj", "v_proj"]}


class ImageInput(nn.Module):
    """Flat square → (C, H, W), grayscale → ``channels``, resize, normalise; then the classifier.

    ``forward`` returns the logits tensor (what the training loop and the tasks expect)."""

    def __init__(
        self,
        classifier: nn.Module,
        shape: tuple[int, ...],
        settings: ImageSettings,
        normalize: bool,
    ) -> None:
        super().__init__()
        self.classifier = classifier
        self.shape = image_shape(shape)
        self.channels = settings.channels
        self.size = settings.size
        mean = torch.tensor(IMAGENET_MEAN if normalize else (0.0,) * 3)[: self.channels]
        std = torch.tensor(IMAGENET_STD if normalize else (1.0,) * 3)[: self.channels]
        # not state: every process builds them alike, so they stay out of the global vector
        self.register_buffer("mean", mean.view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", std.view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.shape)
        if x.shape[1] != self.channels:
            x = x.expand(-1, self.channels, -1, -1) if x.shape[1] == 1 else x[:, : self.channels]
        if self.size is not None and x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        if isinstance(self.classifier, PreActResNet):
            return self.classifier(x)
        return self.classifier(pixel_values=x).logits


def image_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of an image input: flat square vectors are one grayscale channel."""
    if len(shape) == 3:
        return (int(shape[0]), int(shape[1]), int(shape[2]))
    if len(shape) == 2:
        return (1, int(shape[0]), int(shape[1]))
    n = math.prod(shape)
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"a vision model needs image inputs, not {n} flat features")
    return (1, side, side)


def _check(spec: DataSpec, name: str) -> None:
    if spec.input_kind != "dense":
        raise ValueError(f"model {name!r} needs image inputs")
    image_shape(spec.feature_shape)


def _normalize(cfg: ModelConfig) -> bool:
    mode = cfg.image.normalize
    return mode == "imagenet" or (mode == "auto" and cfg.path is not None)


def _pretrained(cls: Any, cfg: ModelConfig, num_classes: int) -> nn.Module:
    """Weights from ``cfg.path`` with a new, randomly initialised classifier (§5.1)."""
    return cls.from_pretrained(cfg.path, num_labels=num_classes, ignore_mismatched_sizes=True)


def _network(
    model_cls: Any, config_cls: Any, cfg: ModelConfig, spec: DataSpec, shape: Any, **extra: Any
) -> nn.Module:
    """Pretrained from ``model.path``, else built from ``shape`` (whose fields are the
    ``transformers`` config's) with random initialisation."""
    if cfg.path is not None:
        return _pretrained(model_cls, cfg, spec.num_classes)
    config = config_cls(
        **shape.model_dump(),
        num_channels=cfg.image.channels,
        num_labels=spec.num_classes,
        **extra,
    )
    return model_cls(config)


@register_model("resnet")
def build_resnet(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """ResNet (default ResNet18) from ``model.resnet``, or pretrained from ``model.path``."""
    from transformers import ResNetConfig, ResNetForImageClassification

    _check(spec, "resnet")
    net = _network(ResNetForImageClassification, ResNetConfig, cfg, spec, cfg.resnet)
    return ImageInput(net, spec.feature_shape, cfg.image, _normalize(cfg))


def vit_lora_settings(cfg: ModelConfig) -> dict[str, Any]:
    """``model.lora`` when the config sets it, else the §5.1 defaults (r 4, α 8, query/value)."""
    if "lora" in cfg.model_fields_set:
        lora = cfg.lora
        return {"r": lora.r, "alpha": lora.alpha, "dropout": lora.dropout, "targets": lora.targets}
    return dict(VIT_LORA)


class PreActBlock(nn.Module):
    """He et al. 2016's pre-activation basic block: BN-ReLU-conv, BN-ReLU-conv, plus shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.shortcut = (
            nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        skip = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + skip


class PreActResNet(nn.Module):
    """Pre-activation ResNet with the CIFAR stem (3×3 conv, no max-pool): PreAct-ResNet-18 at the
    default ``depths`` [2, 2, 2, 2] and widths [64, 128, 256, 512] (FedBaF spec §4.1
    placeholder)."""

    def __init__(self, channels: int, depths: list[int], widths: list[int], classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False)
        blocks: list[nn.Module] = []
        cin = widths[0]
        for i, (depth, width) in enumerate(zip(depths, widths, strict=True)):
            for j in range(depth):
                blocks.append(PreActBlock(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(cin)
        self.classifier = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn(self.blocks(self.stem(x))))
        return self.classifier(F.adaptive_avg_pool2d(out, 1).flatten(1))


@register_model("preact_resnet")
def build_preact_resnet(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """PreAct-ResNet (default 18) from ``model.resnet``'s depths and widths; inputs at their own
    size unless ``image.size`` resizes them."""
    _check(spec, "preact_resnet")
    r = cfg.resnet
    net = PreActResNet(cfg.image.channels, r.depths, r.hidden_sizes, spec.num_classes)
    return ImageInput(net, spec.feature_shape, cfg.image, _normalize(cfg))


@register_model("vit")
def build_vit(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """ViT (default ViT-B/16), every tensor trained (FedBaF spec §4.1: torchvision's ViT-B/16
    unchanged except for the head), or pretrained from ``model.path`` with a new head."""
    from transformers import ViTConfig, ViTForImageClassification

    _check(spec, "vit")
    size = cfg.image.size or image_shape(spec.feature_shape)[1]
    net = _network(ViTForImageClassification, ViTConfig, cfg, spec, cfg.vit, image_size=size)
    return ImageInput(net, spec.feature_shape, cfg.image, _normalize(cfg))


@register_model("vit_lora")
def build_vit_lora(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """ViT (default ViT-B/16) with LoRA adapters injected in place and a trainable classifier;
    every other tensor is frozen, so only the adapters and the head are in the global vector."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import ViTConfig, ViTForImageClassification

    _check(spec, "vit_lora")
    size = cfg.image.size or image_shape(spec.feature_shape)[1]
    net = _network(ViTForImageClassification, ViTConfig, cfg, spec, cfg.vit, image_size=size)
    lora = vit_lora_settings(cfg)
    net.requires_grad_(False)
    net = inject_adapter_in_model(
        LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules=lora["targets"],
        ),
        net,
    )
    for name, p in net.named_parameters():
        p.requires_grad_("lora_" in name)
    net.classifier.requires_grad_(True)
    return ImageInput(net, spec.feature_shape, cfg.image, _normalize(cfg))
