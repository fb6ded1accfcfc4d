"""Which global tensors FedBaF mixes with which foundation tensors (FedBaF spec §2.4).

``match_layers`` pairs the global model's floating-point tensors (the run's ``Layout``) with a
foundation state dict:

- ``exact``: same name and same shape (the paper's rule, the default);
- ``shape_in_order``: walk both in order and pair each global tensor with the next unused
  foundation tensor of the same shape;
- ``leading_slice``: same name, any shapes of the same rank; mix the leading slice both share
  (``W_pre[:out_g, :in_g]``, §2.4's wider/smaller foundation, with P constant over rounds).

``exclude`` patterns (``re.search``) leave tensors out, and integer buffers
(``num_batches_tracked``) are never mixed (§2.4 (b)). A tensor left out trains as plain FL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ...models.layout import Layout

MatchRule = Literal["exact", "shape_in_order", "leading_slice"]
#: buffers that count, never mixed whatever the rule
INTEGER_BUFFERS = r"num_batches_tracked$"


@dataclass(frozen=True)
class Match:
    """One mixed tensor: the global name, the foundation's name, and the shared leading block."""

    name: str
    foundation: str
    block: tuple[int, ...]  # the leading slice both tensors share (the whole tensor if equal)

    def global_indices(self, layout: Layout) -> np.ndarray:
        """Flat indices into the global vector of this tensor's mixed block."""
        spec = next(t for t in layout.tensors if t.name == self.name)
        idx = np.arange(spec.size, dtype=np.int64).reshape(spec.shape)
        return spec.offset + idx[tuple(slice(0, n) for n in self.block)].ravel()

    def foundation_values(self, tensor: np.ndarray) -> np.ndarray:
        return np.asarray(tensor)[tuple(slice(0, n) for n in self.block)].ravel()


def match_layers(
    layout: Layout,
    foundation: Mapping[str, tuple[int, ...]],
    rule: MatchRule = "exact",
    exclude: Sequence[str] = (),
) -> tuple[list[Match], list[str]]:
    """(matches, unmatched global names) of the layout's tensors against foundation shapes."""
    patterns = [re.compile(p) for p in (*exclude, INTEGER_BUFFERS)]
    matches, unmatched = [], []
    unused = list(foundation)
    for t in layout.tensors:
        if any(p.search(t.name) for p in patterns):
            unmatched.append(t.name)
            continue
        found: str | None = None
        block = t.shape
        if rule == "shape_in_order":
            found = next((f for f in unused if tuple(foundation[f]) == t.shape), None)
            if found is not None:
                unused.remove(found)
        elif t.name in foundation:
            shape = tuple(foundation[t.name])
            if shape == t.shape:
                found = t.name
            elif rule == "leading_slice" and len(shape) == len(t.shape):
                found = t.name
                block = tuple(min(a, b) for a, b in zip(shape, t.shape, strict=True))
        if found is None:
            unmatched.append(t.name)
        else:
            matches.append(Match(t.name, found, tuple(block)))
    return matches, unmatched


def matching_report(matches: Sequence[Match], unmatched: Sequence[str], layout: Layout) -> str:
    """One line per global tensor: what it is mixed with, or that it trains as plain FL."""
    by_name = {m.name: m for m in matches}
    lines = []
    for t in layout.tensors:
        m = by_name.get(t.name)
        if m is None:
            lines.append(f"{t.name} {list(t.shape)}: not mixed (plain FL)")
        else:
            whole = m.block == t.shape
            part = "" if whole else f", leading block {list(m.block)}"
            lines.append(f"{t.name} {list(t.shape)}: mixed with {m.foundation}{part}")
    mixed = sum(int(np.prod(m.block)) for m in matches)
    lines.append(f"{len(matches)} tensors mixed ({mixed} values), {len(unmatched)} not mixed")
    return "\n".join(lines)
