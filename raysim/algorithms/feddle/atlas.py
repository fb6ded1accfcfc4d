"""Feddle's model atlas (Feddle spec §3.1–§3.3): a bounded set of client deltas used as search
directions, with importance-score or FIFO eviction and median-norm normalisation.

Pure numpy; the strategy (``method.py``) owns one and checkpoints it with its state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

#: anchors with a smaller norm are not inserted (§3.2 [I]); they still count in |N_k| (§3.6)
MIN_ANCHOR_NORM = 1e-12


@dataclass
class Slot:
    """One anchor: the raw delta over the trainable coordinates and its bookkeeping (§3.1)."""

    delta: np.ndarray
    norm: float  #: ‖delta‖₂, taken once at insertion (the delta never changes)
    score: float
    inserted_round: int
    seq: int
    client_id: int
    tau_rounds: int
    searched: bool = False


class Atlas:
    """``capacity`` anchors at most (M). ``eviction``: ``importance`` replaces the searched slot
    with the smallest score ``|ĉ_m|`` (ties → oldest), ``fifo`` the oldest slot.
    ``new_anchor_score``: ``protect`` keeps an anchor that has not been searched yet from eviction
    (score +inf), ``inherit`` gives it the evicted slot's score (Alg. 1 read literally, A6)."""

    def __init__(
        self,
        capacity: int,
        eviction: Literal["importance", "fifo"] = "importance",
        new_anchor_score: Literal["protect", "inherit"] = "protect",
    ) -> None:
        if capacity < 1:
            raise ValueError(f"atlas capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.eviction = eviction
        self.new_anchor_score = new_anchor_score
        self.slots: list[Slot] = []
        self.next_seq = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.slots)

    def _victim(self) -> int:
        """The slot a new anchor replaces in a full atlas (§3.2, I-7)."""
        if self.eviction == "fifo":
            return min(range(len(self.slots)), key=lambda m: self.slots[m].seq)
        every = list(range(len(self.slots)))
        cand = every
        if self.new_anchor_score == "protect":  # an anchor not yet searched is not a candidate
            cand = [m for m in every if self.slots[m].searched] or every
        return min(cand, key=lambda m: (self.slots[m].score, self.slots[m].seq))

    def insert(self, delta: np.ndarray, round_index: int, client_id: int, tau_rounds: int) -> int:
        """Add one arrival's delta; the index of its slot, or -1 if its norm is negligible."""
        delta = np.array(delta, dtype=np.float32)
        norm = float(np.linalg.norm(delta.astype(np.float64)))
        if norm < MIN_ANCHOR_NORM:
            return -1
        slot = Slot(delta, norm, np.inf, round_index, self.next_seq, client_id, tau_rounds)
        self.next_seq += 1
        if len(self.slots) < self.capacity:
            self.slots.append(slot)
            return len(self.slots) - 1
        m = self._victim()
        if self.new_anchor_score == "inherit":
            slot.score = self.slots[m].score
        self.slots[m] = slot
        self.evictions += 1
        return m

    def norms(self) -> np.ndarray:
        return np.array([s.norm for s in self.slots], dtype=np.float64)

    def normalized(
        self, normalize: Literal["median", "none"] = "median"
    ) -> tuple[np.ndarray, float]:
        """The anchor matrix Ā (|A| × d, float32) and ρ (Eq. 5): every ``ā_m = ρ a_m/‖a_m‖``
        with ρ the median of the raw norms (mean of the two middle ones for an even count,
        A7). ``none`` gives the raw anchors (ablation "Base"), with ρ still reported."""
        norms = self.norms()
        rho = float(np.median(norms))
        if normalize == "none" or len(self.slots) == 1:
            return np.stack([s.delta for s in self.slots]), rho
        scale = (rho / norms).astype(np.float32)
        # float32: |A| × d, the largest object here; stacked and scaled in one pass
        out = np.empty((len(self.slots), self.slots[0].delta.size), dtype=np.float32)
        for m, slot in enumerate(self.slots):
            np.multiply(slot.delta, scale[m], out=out[m])
        return out, rho

    def record_search(self, coefficients: np.ndarray) -> None:
        """After a search: ``s_m = |ĉ_m|`` and every slot has been searched (Alg. 1 line 12)."""
        for slot, c in zip(self.slots, coefficients, strict=True):
            slot.score = float(abs(c))
            slot.searched = True

    def ages(self, round_index: int) -> np.ndarray:
        return np.array([round_index - s.inserted_round for s in self.slots], dtype=np.float64)
