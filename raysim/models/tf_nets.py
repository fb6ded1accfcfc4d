"""The TensorFlow-era CNNs of FedOT's experiments (FedOT spec §6.3), in PyTorch.

- ``alexnet``: the CIFAR-10 tutorial AlexNet of the authors' notebook: conv 5×5·96 SAME, ReLU →
  max-pool 3/2 VALID → LRN(depth radius 4, bias 1, α 0.001/9, β 0.75) → conv 5×5·256 SAME, ReLU
  → max-pool 3/2 VALID → LRN → FC 384, ReLU → FC 192, ReLU → FC classes; Glorot-uniform weights,
  zero biases (5.52 M parameters on 32×32×3, 4.23 M on 28×28×1).
- ``mini_inception``: Zhang et al. (2017)'s small Inception (the authors' sibling code):
  conv 3×3·96 → Inc(32,32) → Inc(32,48) → Down(80) → Inc(112,48) → Inc(96,64) → Inc(80,80) →
  Inc(48,96) → Down(96) → Inc(176,160) → Inc(176,160) → avg-pool 7×7/1 SAME → FC on the flat
  map; every conv is followed by BatchNorm and ReLU (1.86 M parameters on CIFAR-10, 1.81 M on
  MNIST). Inc(a, b) = [conv 1×1·a, conv 3×3·b]; Down(c) = [conv 3×3/2·c, max-pool 3×3/2].
  TensorFlow's SAME padding puts the odd pixel at the end, so strided layers pad (0, 1).

Both read (C, H, W) images (``data.name: hf_image``, or a colour-shifted one-channel set).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raysim.models.registry import DataSpec, ModelConfig, register_model


def _image_shape(spec: DataSpec, name: str) -> tuple[int, int, int]:
    shape = tuple(spec.feature_shape)
    if len(shape) != 3:
        raise ValueError(f"model {name!r} reads (C, H, W) images; the data has shape {shape}")
    return shape  # type: ignore[return-value]


class AlexNet(nn.Module):
    def __init__(self, shape: tuple[int, int, int], classes: int) -> None:
        super().__init__()
        c, h, _ = shape
        self.features = nn.Sequential(
            nn.Conv2d(c, 96, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
            nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0),
            nn.Conv2d(96, 256, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
            nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0),
            nn.Flatten(),
        )
        side = ((h - 3) // 2 + 1 - 3) // 2 + 1
        self.classifier = nn.Sequential(
            nn.Linear(256 * side * side, 384),
            nn.ReLU(),
            nn.Linear(384, 192),
            nn.ReLU(),
            nn.Linear(192, classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class ConvBN(nn.Sequential):
    """conv (TF SAME padding) → BatchNorm → ReLU."""

    def __init__(self, c_in: int, c_out: int, k: int, stride: int = 1) -> None:
        pad = (0, 1, 0, 1) if stride == 2 else (k // 2,) * 4
        super().__init__(
            nn.ZeroPad2d(pad),
            nn.Conv2d(c_in, c_out, k, stride, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
        )


class Inception(nn.Module):
    def __init__(self, c_in: int, a: int, b: int) -> None:
        super().__init__()
        self.one, self.three = ConvBN(c_in, a, 1), ConvBN(c_in, b, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.one(x), self.three(x)], dim=1)


class Downsample(nn.Module):
    def __init__(self, c_in: int, c: int) -> None:
        super().__init__()
        self.conv = ConvBN(c_in, c, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float("-inf")), 3, 2)
        return torch.cat([self.conv(x), pooled], dim=1)


class MiniInception(nn.Module):
    #: (kind, args) after the stem: Inc(a, b) or Down(c)
    PLAN = (
        ("inc", 32, 32), ("inc", 32, 48), ("down", 80),
        ("inc", 112, 48), ("inc", 96, 64), ("inc", 80, 80), ("inc", 48, 96), ("down", 96),
        ("inc", 176, 160), ("inc", 176, 160),
    )  # fmt: skip

    def __init__(self, shape: tuple[int, int, int], classes: int) -> None:
        super().__init__()
        c, h, _ = shape
        layers: list[nn.Module] = [ConvBN(c, 96, 3)]
        width = 96
        for kind, *args in self.PLAN:
            if kind == "inc":
                layers.append(Inception(width, *args))
                width = args[0] + args[1]
            else:
                layers.append(Downsample(width, args[0]))
                width = args[0] + width
                h = (h + 1) // 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(width * h * h, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = F.avg_pool2d(x, 7, 1, padding=3, count_include_pad=False)  # SAME, TF's averaging
        return self.head(x.flatten(1))


@register_model("alexnet")
def build_alexnet(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """FedOT spec §6.3's AlexNet (the authors' notebook)."""
    return AlexNet(_image_shape(spec, "alexnet"), spec.num_classes)


@register_model("mini_inception")
def build_mini_inception(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """FedOT spec §6.3's InceptionNet: Zhang et al. (2017)'s mini-Inception with BatchNorm."""
    return MiniInception(_image_shape(spec, "mini_inception"), spec.num_classes)
