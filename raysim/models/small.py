"""Small models for the offline datasets: MLP, CNN (1-D or 2-D), bag of embeddings, and a
Transformer language model on token sequences."""

from __future__ import annotations

import math

import torch
from torch import nn

from raysim.models.registry import DataSpec, ModelConfig, register_model


def _mlp(sizes: list[int], dropout: float) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-2], sizes[1:-1], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(sizes[-2], sizes[-1]))
    return layers


@register_model("mlp")
def build_mlp(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """Flatten → [Linear → ReLU]* → Linear."""
    if spec.input_kind != "dense":
        raise ValueError("model 'mlp' needs dense inputs; use 'bag_of_embeddings' for text")
    sizes = [math.prod(spec.feature_shape), *cfg.hidden, spec.num_classes]
    return nn.Sequential(nn.Flatten(), *_mlp(sizes, cfg.dropout))


class _Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


@register_model("cnn")
def build_cnn(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    """Conv(3) [→ BatchNorm] → ReLU blocks, one max-pool, then an MLP head; 2-D for images, else
    1-D. BatchNorm statistics travel as the model's buffers (``models/layout.py``).

    A flat 64-feature input (sklearn digits) is viewed as 1×8×8, a flat 40-feature one (mnist1d)
    as 1×40, and a (C, H, W) input is taken as it is. Feddle spec §5.1's CNN on 3×32×32 images is
    ``channels: [32, 64, 64]``, ``hidden: [128]``: FC(16384→128)–ReLU–FC(128→C), whose first FC
    output is the body's features (§3.5).
    """
    if spec.input_kind != "dense":
        raise ValueError("model 'cnn' needs dense inputs")
    n = math.prod(spec.feature_shape)
    side = math.isqrt(n)
    if len(spec.feature_shape) == 3:
        shape: tuple[int, ...] = tuple(spec.feature_shape)
        two_d = True
    else:
        two_d = side * side == n and len(spec.feature_shape) <= 2 and n > 16
        shape = (1, side, side) if two_d else (1, n)
    conv, pool = (nn.Conv2d, nn.MaxPool2d) if two_d else (nn.Conv1d, nn.MaxPool1d)
    norm = nn.BatchNorm2d if two_d else nn.BatchNorm1d
    layers: list[nn.Module] = [_Reshape(shape)]
    c_in = shape[0]
    for c in cfg.channels:
        layers += [conv(c_in, c, 3, padding=1), *([norm(c)] if cfg.batch_norm else []), nn.ReLU()]
        c_in = c
    layers += [pool(2), nn.Flatten()]
    pooled = [s // 2 for s in shape[1:]]
    flat = c_in * math.prod(pooled)
    layers += _mlp([flat, *cfg.hidden, spec.num_classes], cfg.dropout)
    return nn.Sequential(*layers)


class BagOfEmbeddings(nn.Module):
    """Mean of token embeddings (padding id 0 ignored) → MLP head."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden: list[int], num_classes: int):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, mode="mean", padding_idx=0)
        self.head = nn.Sequential(*_mlp([embed_dim, *hidden, num_classes], 0.0))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(tokens))


@register_model("bag_of_embeddings")
def build_bag_of_embeddings(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    if spec.input_kind != "tokens" or not spec.vocab_size:
        raise ValueError("model 'bag_of_embeddings' needs token inputs (e.g. data.name=bbc_news)")
    return BagOfEmbeddings(spec.vocab_size, cfg.embed_dim, cfg.hidden, spec.num_classes)


class TransformerLM(nn.Module):
    """Token ids ``(N, L)`` → next-token logits ``(N, V, L)`` (class dimension second, so the
    classification loss and accuracy apply per position)."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.d = d
        self.embedding = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.decoder = nn.Linear(d, vocab)

    def positions(self, length: int, device: torch.device) -> torch.Tensor:
        pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, self.d, 2, device=device) * (-math.log(1e4) / self.d))
        pe = torch.zeros(length, self.d, device=device)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq[: self.d // 2])
        return pe

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embedding(tokens) * math.sqrt(self.d) + self.positions(length, tokens.device)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        h = self.encoder(x, mask=mask, is_causal=True)
        return self.decoder(h).transpose(1, 2)


@register_model("transformer_lm")
def build_transformer_lm(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    if spec.input_kind != "tokens" or not spec.vocab_size:
        raise ValueError("model 'transformer_lm' needs token sequences (e.g. data.name=markov)")
    t = cfg.transformer
    return TransformerLM(spec.vocab_size, cfg.embed_dim, t.layers, t.heads, t.ffn, cfg.dropout)
