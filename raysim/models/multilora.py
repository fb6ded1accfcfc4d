"""k clients' LoRA adapters on one frozen base, trained in one forward and backward pass.

PEFT applies one active adapter to a whole batch in training (its mixed-adapter batches are
inference only). ``MultiLoRA`` stacks one adapter's tensors of k clients (A: (k, r, in), B:
(k, out, r) per LoRA layer) and, inside ``route(owner)``, makes every LoRA layer compute

    y = base(x) + scaling · (x A_c(n)ᵀ) B_c(n)ᵀ      for sample n of client c(n) = owner[n]

so the concatenated micro-batches of k clients share the base's matmuls (once, over a k times
larger batch) while each sample's low-rank term uses its own client's adapter (a batched matmul
over the adapters gathered per sample). ``client_losses`` reduces a causal LM's token losses per
client, so the sum of the returned losses gives each client's stacked slice exactly the gradient
of its own mean loss, as k separate PEFT passes would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn


def lora_layers(model: nn.Module, adapter: str) -> list[tuple[str, nn.Module]]:
    """(name, PEFT LoRA ``Linear``) of every layer that carries ``adapter``."""
    from peft.tuners.lora import Linear as LoraLinear

    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, LoraLinear) and adapter in m.lora_A
    ]


class MultiLoRA:
    """One adapter of k clients, stacked over the LoRA layers of one PEFT model."""

    def __init__(self, model: nn.Module, adapter: str, k: int) -> None:
        self.model, self.adapter, self.k = model, adapter, k
        self.layers = lora_layers(model, adapter)
        if not self.layers:
            raise ValueError(f"the model has no LoRA layer with adapter {adapter!r}")
        for name, layer in self.layers:
            if not isinstance(layer.lora_dropout[adapter], nn.Identity):
                raise ValueError(f"{name}: multi-LoRA needs lora_dropout 0 (dropout is per client)")
            if layer.use_dora.get(adapter):
                raise ValueError(f"{name}: multi-LoRA does not run DoRA")
        self.A = [self._stack(layer.lora_A[adapter].weight) for _, layer in self.layers]
        self.B = [self._stack(layer.lora_B[adapter].weight) for _, layer in self.layers]
        self._owner: torch.Tensor | None = None

    def _stack(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.detach().unsqueeze(0).repeat(self.k, 1, 1).requires_grad_(True)

    def parameters(self) -> list[torch.Tensor]:
        """Every stacked tensor, A then B per layer (client axis first)."""
        return [t for pair in zip(self.A, self.B, strict=True) for t in pair]

    def names(self) -> list[str]:
        """The PEFT parameter names of ``parameters``, in the same order."""
        a = self.adapter
        return [f"{name}.lora_{part}.{a}.weight" for name, _ in self.layers for part in ("A", "B")]

    @torch.no_grad()
    def load(self, client: int, tensors: Sequence[torch.Tensor]) -> None:
        """Client ``client``'s adapter, as ``parameters`` orders it (A, B per layer)."""
        for stacked, t in zip(self.parameters(), tensors, strict=True):
            stacked[client].copy_(t)

    def unstack(self, client: int) -> list[torch.Tensor]:
        return [t[client].detach() for t in self.parameters()]

    @contextlib.contextmanager
    def route(self, owner: torch.Tensor) -> Iterator[None]:
        """Inside: LoRA layers read sample n's adapter from client ``owner[n]``."""
        saved = []
        for (_, layer), a, b in zip(self.layers, self.A, self.B, strict=True):
            saved.append((layer, layer.forward))
            layer.forward = self._forward(layer, a, b, owner)
        try:
            yield
        finally:
            for layer, forward in saved:
                layer.forward = forward

    def _forward(self, layer: nn.Module, a: torch.Tensor, b: torch.Tensor, owner: torch.Tensor):
        scaling = layer.scaling[self.adapter]
        base = layer.base_layer

        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            out = base(x, *args, **kwargs)
            flat = x.reshape(x.shape[0], -1, x.shape[-1]).to(a.dtype)
            low = torch.bmm(flat, a[owner].transpose(1, 2))
            delta = torch.bmm(low, b[owner].transpose(1, 2)) * scaling
            # as PEFT's LoRA layer: the base's output plus the adapter's in the adapter's dtype,
            # rounded to the base's once (a bf16 base: two roundings gave 5 % off gradients)
            return (out + delta.reshape(*out.shape)).to(out.dtype)

        return forward


def client_losses(
    logits: torch.Tensor, labels: torch.Tensor, owner: torch.Tensor, k: int
) -> torch.Tensor:
    """(k,) each client's mean next-token cross-entropy over its labelled tokens (-100: none),
    as ``LlamaForCausalLM`` computes it for that client's rows alone."""
    shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    shift_labels = labels[:, 1:].reshape(-1)
    token = nn.functional.cross_entropy(
        shift_logits, shift_labels, ignore_index=-100, reduction="none"
    ).view(labels.shape[0], -1)
    counted = (labels[:, 1:] != -100).to(token.dtype)
    per_row, tokens_per_row = token.sum(dim=1), counted.sum(dim=1)
    total = torch.zeros(k, dtype=token.dtype, device=token.device).index_add(0, owner, per_row)
    count = torch.zeros(k, dtype=token.dtype, device=token.device).index_add(
        0, owner, tokens_per_row
    )
    return total / count.clamp(min=1.0)
