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


def _as_numpy(p: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy: float64 kept (FedOT's dual heads), other floats as float32."""
    p = p.detach().cpu()
    return (p if p.dtype == torch.float64 else p.float()).numpy().copy()


def _sites(module: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """id(parameter) → every (owner module, attribute) it sits at (several when tied)."""
    sites: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for _, owner in module.named_modules():
        for attr, p in owner._parameters.items():
            if p is not None:
                sites.setdefault(id(p), []).append((owner, attr))
    return sites


class ModelHandle:
    """A plain module whose trainable tensors are sorted into the method's parameter groups.

    A group with a name pattern takes the tensors it matches; the group without one takes the
    rest. When several groups have no pattern (Ditto's ``global`` and ``personal``), the first
    takes the module's own tensors of the rest and every other one a copy of them, named
    ``"<group>/<name>"`` in ``get_state``; ``use(group)`` then puts that group's copy into the
    module (``switches_groups``). Buffers (BatchNorm statistics) are never copied: every group
    sees the same ones, which travel in the global vector.

    Personal and ascent groups start, on a client's first visit, from the values the model was
    built with (every process builds it from the run's init stream).

    A client's ``train`` gets it as ``ctx.model``: ``module`` is the ``torch.nn.Module`` to run,
    ``global_parameters()`` the shared tensors local training updates, ``group_parameters(name)``
    a declared group's. After ``train`` the worker reads the update from ``get_global()`` and the
    personal state from ``get_state()``. A LoRA model's handle
    (``raysim.models.causal_lm.LoraHandle``) has the same methods, each group an adapter.
    """

    switches_groups = False
    """Whether ``use`` chooses which groups forward passes apply (LoRA adapters, copies of the
    rest) rather than every group always being applied."""
    has_hidden_states = False
    """Whether ``module(..., output_hidden_states=True)`` returns per-layer features."""

    def __init__(
        self, module: torch.nn.Module, groups: Sequence[ParamGroup] = DEFAULT_GROUPS
    ) -> None:
        self.module = module
        """The resident ``torch.nn.Module``: what forward passes run."""
        self.groups = check_groups(groups)
        """The method's parameter groups (``Method.groups``); the first is the shared one."""
        rest = [g for g in self.groups if g.params is None]
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
        if len(rest) > 1:
            self._copy_rest([g.name for g in rest])
        self.global_adapter = self.groups[0].name
        """The shared group's name."""
        self._global = self._by_group[self.global_adapter]
        self._buffers = _persistent_buffers(module)
        self._initial_state = self.get_state()

    def _copy_rest(self, rest: list[str]) -> None:
        """Give every rest group after the first its own copy of the first one's tensors."""
        originals = self._by_group[rest[0]]
        sites = _sites(self.module)
        self._rest = rest
        self._sites = [sites[id(p)] for _, p in originals]
        for g in rest[1:]:
            self._by_group[g] = [
                (f"{g}/{n}", torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))
                for n, p in originals
            ]
        self.switches_groups = True

    # --------------------------------------------------------------- groups
    def group_parameters(self, group: str) -> list[torch.nn.Parameter]:
        """The trainable tensors of ``group``, in module order."""
        return [p for _, p in self._by_group[group]]

    def get_group(self, group: str) -> np.ndarray:
        """``group``'s tensors as one flat float32 vector (a copy)."""
        return flatten(self.group_parameters(group))

    def set_group(self, group: str, flat: np.ndarray) -> None:
        """Load a flat vector of ``get_group``'s form into ``group``'s tensors."""
        assign(self.group_parameters(group), flat)

    # the fedoa clients' names: on a LoRA model a group is the adapter of the same name
    adapter_parameters = group_parameters
    """``group_parameters``, by the name a LoRA adapter goes by."""
    get_adapter = get_group
    """``get_group``, by the name a LoRA adapter goes by."""
    set_adapter = set_group
    """``set_group``, by the name a LoRA adapter goes by."""

    def global_parameters(self) -> list[torch.nn.Parameter]:
        """The shared group: what local training updates and the server aggregates."""
        return [p for _, p in self._global]

    def use(self, group: str) -> None:
        """Select what forward passes apply: ``group``'s copy of the rest when it has one, else
        the module's own tensors (every group with a pattern is always applied)."""
        if group not in self._by_group:
            raise ValueError(f"this model has no parameter group {group!r}")
        if not self.switches_groups:
            return
        chosen = self._by_group[group if group in self._rest else self._rest[0]]
        for (_, p), sites in zip(chosen, self._sites, strict=True):
            for owner, attr in sites:
                owner._parameters[attr] = p

    # --------------------------------------------------------------- the global vector
    def layout(self) -> Layout:
        """The global vector's layout: the shared group's tensors, then the buffers."""
        entries = [(n, tuple(p.shape), SHARED) for n, p in self._global]
        entries += [(n, tuple(b.shape), BUFFERS) for n, b in self._buffers]
        return Layout(entries)

    def global_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every tensor of the global vector, in order."""
        return self.layout().shapes()

    @property
    def global_is_parameters(self) -> bool:
        """True when the global vector is the shared group's parameters alone (no buffers)."""
        return not self._buffers

    def get_global(self) -> np.ndarray:
        """The global vector now held: the shared group's tensors, then the buffers, flat
        float32 (a copy)."""
        flat = flatten(self.global_parameters())
        if not self._buffers:
            return flat
        return np.concatenate([flat, flatten([b for _, b in self._buffers])])

    def set_global(self, flat: np.ndarray) -> None:
        """Load a global vector (``get_global``'s form) into the module; integer buffers get
        their values rounded."""
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
        """The names of the groups that stay with a client (``personal`` and ``ascent``)."""
        return [g.name for g in self.groups if g.role != "shared"]

    def get_state(self) -> dict[str, np.ndarray]:
        """The client's personal state after local work: every non-shared tensor, by name
        (float32, or float64 for a float64 tensor)."""
        return {n: _as_numpy(p) for g in self.personal_groups() for n, p in self._by_group[g]}

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
