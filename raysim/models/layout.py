"""Parameter groups (declared by a method) and the layout of the global vector (names, shapes).

A method declares its **parameter groups**; the model handle sorts the resident model's tensors into
them:

- ``shared``: trained on clients, sent up and averaged by the server (the global vector);
- ``personal``: trained on clients, kept by the client, never sent to the server;
- ``ascent``: client-held like ``personal``, but trained by gradient *ascent* (a max player such as
  FedOT's dual potentials); what of it reaches the server is the method's choice (side channels).

Non-trainable **buffers** (BatchNorm statistics) are not a group a method declares: every model
that has them carries them in their own block of the global vector, after the shared parameters,
so that each client starts from the global buffers and a result never depends on the worker that
ran it. ``Layout`` says which coordinates are which.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Role = Literal["shared", "personal", "ascent"]
"""A parameter group's role: ``shared`` (averaged by the server), ``personal`` (kept by its
client) or ``ascent`` (kept by its client, trained by gradient ascent)."""
SHARED = "shared"
"""The layout group of the shared trainable parameters (``Layout.mask(SHARED)``: their
coordinates of the global vector)."""
BUFFERS = "buffers"
"""The layout group of the buffers (BatchNorm statistics), after the shared parameters."""


@dataclass(frozen=True)
class ParamGroup:
    """A named group of the resident model's trainable tensors and its role.

    ``params`` is a regular expression over parameter names (``re.search``); ``None`` means: on a
    LoRA model, the adapter of this name; on a plain module, every trainable tensor that no other
    group claims (when several groups leave it ``None``, the first takes those tensors and each
    other one its own copy of them: ``ModelHandle``).
    """

    name: str
    """The group's name (``model.use(name)``, ``Method.evaluate_with``)."""
    role: Role = "shared"
    """``shared``, ``personal`` or ``ascent``."""
    params: str | None = None
    """A regular expression over parameter names, or None (see above)."""

    def matches(self, param_name: str) -> bool:
        """Whether ``params`` is set and finds ``param_name`` (``re.search``)."""
        return self.params is not None and re.search(self.params, param_name) is not None


DEFAULT_GROUPS: tuple[ParamGroup, ...] = (ParamGroup("global", "shared"),)
"""What a method gets when it declares nothing: every trainable tensor is shared."""


def check_groups(groups: Sequence[ParamGroup]) -> tuple[ParamGroup, ...]:
    """Validate a method's groups: unique names, exactly one ``shared`` group, listed first."""
    groups = tuple(groups)
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise ValueError(f"parameter groups must have unique names, got {names}")
    shared = [g for g in groups if g.role == "shared"]
    if len(shared) != 1 or groups[0].role != "shared":
        raise ValueError("a method declares exactly one shared parameter group, first in the list")
    return groups


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the global vector."""

    name: str
    """The tensor's name (the model's name of the parameter or buffer)."""
    shape: tuple[int, ...]
    """Its shape."""
    group: str
    """``SHARED`` or ``BUFFERS``."""
    offset: int
    """Where its values start in the vector."""

    @property
    def size(self) -> int:
        """How many values it has."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def slice(self) -> slice:
        """Its coordinates in the vector: ``flat[spec.slice]`` are its values, row-major."""
        return slice(self.offset, self.offset + self.size)


class Layout:
    """Names, shapes and groups of the flat global vector (what strategies aggregate).

    Strategies use it to treat coordinates differently (e.g. Feddle leaves ``buffers`` out of its
    anchors, FedBaF biases only the tensors it matches) and to export named tensors.
    """

    def __init__(self, tensors: Iterable[tuple[str, Sequence[int], str]]) -> None:
        specs, offset = [], 0
        for name, shape, group in tensors:
            spec = TensorSpec(name, tuple(int(s) for s in shape), group, offset)
            specs.append(spec)
            offset += spec.size
        self.tensors: tuple[TensorSpec, ...] = tuple(specs)
        """Every tensor of the vector, in vector order."""
        self.size = offset
        """The vector's length."""

    def __len__(self) -> int:
        return len(self.tensors)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.tensors == other.tensors

    def __repr__(self) -> str:
        groups = {g: sum(t.size for t in self.tensors if t.group == g) for g in self.groups}
        return f"Layout({len(self.tensors)} tensors, {self.size} values, {groups})"

    @property
    def groups(self) -> list[str]:
        """The groups present, in vector order (``SHARED``, then ``BUFFERS`` if any)."""
        return list(dict.fromkeys(t.group for t in self.tensors))

    @property
    def names(self) -> list[str]:
        """Every tensor's name, in vector order."""
        return [t.name for t in self.tensors]

    def shapes(self, group: str | None = None) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every tensor of ``group`` (None: all), in vector order."""
        return [(t.name, t.shape) for t in self.tensors if group is None or t.group == group]

    def select(self, group: str | None = None, pattern: str | None = None) -> list[TensorSpec]:
        """Tensors of ``group`` whose names match ``pattern`` (``re.search``), in vector order."""
        return [
            t
            for t in self.tensors
            if (group is None or t.group == group)
            and (pattern is None or re.search(pattern, t.name))
        ]

    def mask(self, group: str | None = None, pattern: str | None = None) -> np.ndarray:
        """Boolean mask over the vector: the coordinates of ``select(group, pattern)``."""
        m = np.zeros(self.size, dtype=bool)
        for t in self.select(group, pattern):
            m[t.slice] = True
        return m

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """name → view of ``flat`` with the tensor's shape."""
        if flat.shape != (self.size,):
            raise ValueError(f"vector of shape {flat.shape}, the layout has {self.size} values")
        return {t.name: flat[t.slice].reshape(t.shape) for t in self.tensors}

    def flatten(self, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
        """The inverse of ``unflatten`` (float32)."""
        return (
            np.concatenate(
                [np.asarray(tensors[t.name], dtype=np.float32).reshape(-1) for t in self.tensors]
            )
            if self.tensors
            else np.zeros(0, dtype=np.float32)
        )
