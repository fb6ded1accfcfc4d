"""``ModelHandle``: how the runtime sees a resident model.

Two things cross its boundary: the **global vector** (the shared parameter group, then the model's
buffers; what is sent to and from the server, described by ``layout()``) and the **personal
state** (every personal or ascent group: what stays with a virtual client between its visits and
never reaches the server). Swapping one virtual client for the next is ``set_global`` +
``set_state``; because buffers travel in the global vector, every client starts from the global
buffers and a result never depends on which client a worker ran before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from raysim.models.layout import BUFFERS, DEFAULT_GROUPS, SHARED, Layout, ParamGroup, check_groups
from raysim.models.params import assign, flatten


def _persistent_buffers(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Buffers that belong to the model's state (BatchNorm statistics), not scratch ones."""
    keys = set(module.state_dict(keep_vars=True))
    return [(n, b) for n, b in module.named_buffers() if n in keys]


class ModelHandle:
    """A plain module whose trainable tensors are sorted into the method's parameter groups.

    A group with a name pattern takes the tensors it matches; the group without one takes the
    rest. Personal and ascent groups start, on a client's first visit, from the values the model
    was built with (every process builds it from the run's init stream).
    """

    #: whether ``use`` chooses which groups forward passes apply (LoRA adapters) rather than
    #: every group always being applied (a plain module)
    switches_groups = False

    def __init__(
        self, module: torch.nn.Module, groups: Sequence[ParamGroup] = DEFAULT_GROUPS
    ) -> None:
        self.module = module
        self.groups = check_groups(groups)
        rest = [g for g in self.groups if g.params is None]
        if len(rest) > 1:
            raise ValueError(
                f"groups {[g.name for g in rest]} all claim 'the remaining parameters'; give "
                "all but one a params pattern"
            )
        self._by_group: dict[str, list[tuple[str, torch.nn.Parameter]]] = {
            g.name: [] for g in self.groups
        }
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            group = next((g for g in self.groups if g.matches(name)), rest[0] if rest else None)
            if group is None:
                raise ValueError(f"parameter {name!r} belongs to no parameter group")
            self._by_group[group.name].append((name, p))
        self.global_adapter = self.groups[0].name
        self._global = self._by_group[self.global_adapter]
        self._buffers = _persistent_buffers(module)
        self._initial_state = self.get_state()

    # --------------------------------------------------------------- groups
    def group_parameters(self, group: str) -> list[torch.nn.Parameter]:
        return [p for _, p in self._by_group[group]]

    def get_group(self, group: str) -> np.ndarray:
        return flatten(self.group_parameters(group))

    def set_group(self, group: str, flat: np.ndarray) -> None:
        assign(self.group_parameters(group), flat)

    def global_parameters(self) -> list[torch.nn.Parameter]:
        """The shared group: what local training updates and the server aggregates."""
        return [p for _, p in self._global]

    def use(self, group: str) -> None:
        """Select what forward passes apply; on a plain module every group is always applied."""
        if group not in self._by_group:
            raise ValueError(f"this model has no parameter group {group!r}")

    # --------------------------------------------------------------- the global vector
    def layout(self) -> Layout:
        entries = [(n, tuple(p.shape), SHARED) for n, p in self._global]
        entries += [(n, tuple(b.shape), BUFFERS) for n, b in self._buffers]
        return Layout(entries)

    def global_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return self.layout().shapes()

    def get_global(self) -> np.ndarray:
        flat = flatten(self.global_parameters())
        if not self._buffers:
            return flat
        return np.concatenate([flat, flatten([b for _, b in self._buffers])])

    def set_global(self, flat: np.ndarray) -> None:
        if not self._buffers:
            assign(self.global_parameters(), flat)
            return
        n = sum(p.numel() for p in self.global_parameters())
        assign(self.global_parameters(), flat[:n])
        buffers = [b for _, b in self._buffers]
        # integer buffers (num_batches_tracked) come back rounded, not truncated
        rest = np.array(flat[n:], dtype=np.float32)
        offset = 0
        for b in buffers:
            k = b.numel()
            if not b.is_floating_point():
                rest[offset : offset + k] = np.rint(rest[offset : offset + k])
            offset += k
        assign(buffers, rest)

    # --------------------------------------------------------------- personal state
    def personal_groups(self) -> list[str]:
        return [g.name for g in self.groups if g.role != "shared"]

    def get_state(self) -> dict[str, np.ndarray]:
        """The client's personal state after local work: every non-shared tensor, by name."""
        return {
            n: p.detach().float().cpu().numpy().copy()
            for g in self.personal_groups()
            for n, p in self._by_group[g]
        }

    def set_state(self, state: Mapping[str, np.ndarray] | None, seed: int) -> None:
        """Load a client's personal state; ``None`` = first visit (the built values)."""
        if not self.personal_groups():
            if state:
                raise ValueError("this model keeps no personal state")
            return
        source = self._initial_state if state is None else state
        with torch.no_grad():
            for g in self.personal_groups():
                for n, p in self._by_group[g]:
                    p.copy_(torch.from_numpy(np.array(source[n])).to(p.dtype))
