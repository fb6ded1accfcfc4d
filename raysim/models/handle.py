"""``ModelHandle``: how the runtime sees a resident model.

Two things cross its boundary: the **global** weight vector (what is sent to and from the server)
and an optional **personal state** (what stays with a virtual client between its visits and never
reaches the server). Swapping one virtual client for the next is ``set_global`` + ``set_state``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from raysim.models.params import assign, flatten


class ModelHandle:
    """A plain module: the global vector is every trainable parameter; no personal state."""

    global_adapter = "global"

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._global = [(n, p) for n, p in module.named_parameters() if p.requires_grad]

    def global_parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self._global]

    def global_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(n, tuple(p.shape)) for n, p in self._global]

    def get_global(self) -> np.ndarray:
        return flatten(self.global_parameters())

    def set_global(self, flat: np.ndarray) -> None:
        assign(self.global_parameters(), flat)

    def get_state(self) -> dict[str, np.ndarray]:
        """The client's personal state after local work (empty: nothing is personal)."""
        return {}

    def set_state(self, state: Mapping[str, np.ndarray] | None, seed: int) -> None:
        """Load a client's personal state; ``None`` = first visit, initialise from ``seed``."""
        if state:
            raise ValueError("this model keeps no personal state")

    def use(self, adapter: str) -> None:
        """Select the adapter applied in forward passes; a plain module has only the global one."""
        if adapter != self.global_adapter:
            raise ValueError(f"this model has no adapter {adapter!r}")
