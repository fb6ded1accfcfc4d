"""Feddle's out-of-domain surrogate (Feddle spec §3.5): a linear probe θ on the model's features,
fitted on OOD labels (Eq. 9), whose loss ``h`` the coefficient search then minimises (Eq. 10).

The body/head split [I]: the head is the model's last ``nn.Linear`` (the CNN's and MLP's last
fully connected layer) and the features are its input. The head's own output is never used by
``h``, so the head coordinates of ``ω'`` get exactly zero gradient (I-12), yet the search's step
moves them with the body-derived coefficients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def head_of(module: torch.nn.Module) -> torch.nn.Linear:
    """The model's linear head: its last ``nn.Linear``."""
    linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        raise ValueError("Feddle-OOD needs a model whose head is a torch.nn.Linear")
    return linears[-1]


def features(module: torch.nn.Module, head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The head's input for ``x`` (the body's output), captured by a forward pre-hook."""
    seen: list[torch.Tensor] = []

    def grab(_mod: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen.append(args[0])

    handle = head.register_forward_pre_hook(grab)
    try:
        module(x)
    finally:
        handle.remove()
    return seen[-1]


class ProbeTask:
    """``h``: cross-entropy of the probe ``theta`` on the body's features (a ``Task``)."""

    def __init__(self, theta: torch.nn.Linear, head: torch.nn.Linear) -> None:
        self.theta, self.head = theta, head
        self._ce = torch.nn.CrossEntropyLoss()

    def num_examples(self, data: tuple[torch.Tensor, torch.Tensor]) -> int:
        return len(data[1])

    def batch(self, data, index):
        return data[0][index], data[1][index]

    def loss(self, module: torch.nn.Module, batch: Any) -> torch.Tensor:
        return self._ce(self.theta(features(module, self.head, batch[0])), batch[1])


def new_probe(in_features: int, classes: int, seed: int, like: torch.Tensor) -> torch.nn.Linear:
    """A fresh probe, initialised from ``seed`` (PyTorch's default Linear init)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probe = torch.nn.Linear(in_features, classes)
    return probe.to(device=like.device, dtype=like.dtype)


def probe_state(probe: torch.nn.Linear) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in probe.state_dict().items()}


def load_probe(probe: torch.nn.Linear, state: Mapping[str, np.ndarray]) -> None:
    probe.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})


def fit_probe(
    probe: torch.nn.Linear,
    module: torch.nn.Module,
    head: torch.nn.Linear,
    data: tuple[torch.Tensor, torch.Tensor],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
) -> float:
    """Eq. 9: fit θ on the body's (frozen, ``eval()``-mode) features with Adam; the mean loss of
    the last epoch. The features are computed once: the body does not change here."""
    module.eval()
    with torch.no_grad():
        feats = torch.cat(
            [
                features(module, head, data[0][i : i + batch_size])
                for i in range(0, len(data[1]), batch_size)
            ]
        )
    opt = torch.optim.Adam(probe.parameters(), lr=lr)
    ce = torch.nn.CrossEntropyLoss()
    last = float("nan")
    for _ in range(epochs):
        order = torch.randperm(len(data[1]), generator=generator)
        total = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad()
            loss = ce(probe(feats[idx]), data[1][idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        last = total / len(order)
    return last
