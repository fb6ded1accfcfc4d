"""Weighted sums of client updates that do not depend on their order or grouping.

A float32 running sum changes in its last bits with the order of its terms, so a sum built from
partial sums (one per worker, one per node) would depend on how many workers and nodes there
are. Here every term ``w·Δ`` is rounded once to a fixed-point integer, ``q = rint(w·Δ·2^s)``
(computed in float64, where a float32 ``Δ`` times ``w·2^s`` loses at most one rounding), and the
integers are added in int64, which is exact and associative: any grouping, in any order, on any
number of processes gives the same bits. The float32 result is ``Σq · 2^-s``, rounded once.

- **Precision**: ``FRACTION_BITS`` = 40: each term is within 2^-41 ≈ 4.5e-13 of ``w·Δ``, so a
  sum of J terms is within J·4.5e-13 of the exact sum: below half a float32 ulp of the result
  wherever a coordinate exceeds J·2^-17 ≈ J·7.6e-6, and an absolute J·4.5e-13 below that.
- **Headroom**: a coordinate of a sum holds magnitudes below 2^22 ≈ 4.2e6 (``LIMIT`` = 2^62 in
  units of 2^-40, one bit spare of int64). The bound ``Σ max|q|`` over the terms so far (an
  exact integer, the same for every grouping), plus each rounded block about to be added, is
  checked against it; past it the sum stops with ``SumOverflow`` naming the cause, never wraps.
- **Cost**: 3–4× a float32 ``out += w*d`` (blocked so the float64 temporaries stay in cache).

Non-finite terms are refused (the coordinator rejects non-finite updates before they reach a
sum). This module imports numpy only: the per-node reducers (``raysim.actors.reduce``) load it
without torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import Diverged

#: fixed-point fraction bits: a term's resolution is 2^-FRACTION_BITS
FRACTION_BITS = 40
#: the largest bound (in units of 2^-FRACTION_BITS) a sum may reach: one bit of int64 spare
LIMIT = 1 << 62
#: elements per block: float64 temporaries of 256 KiB stay in a core's cache
BLOCK = 1 << 15


class SumOverflow(Diverged):
    """A weighted sum would leave the fixed-point range (``LIMIT``): the run stops, one line."""


def headroom() -> float:
    """The largest magnitude one coordinate of a sum can hold (2^22 with 40 fraction bits)."""
    return math.ldexp(LIMIT, -FRACTION_BITS)


@dataclass
class Partial:
    """A weighted sum in fixed point: ``total`` (int64, units of 2^-FRACTION_BITS), ``bound`` ≥
    every ``|total[i]|`` (an exact integer), ``terms`` added. Partials add exactly in any order."""

    total: np.ndarray | None = None
    bound: int = 0
    terms: int = 0

    def add(self, delta: np.ndarray, weight: float) -> Partial:
        """Add ``weight·delta`` (a float32 vector) in place; returns self. Each block is rounded,
        then checked before it is added: the sum's bound plus the term's largest value so far
        must stay below ``LIMIT`` (``SumOverflow``); the term's largest value then joins the
        bound, which ends the same in any grouping."""
        if not math.isfinite(weight):
            raise ValueError("an exact sum takes finite updates and weights only")
        delta = np.asarray(delta)
        scale = math.ldexp(float(weight), FRACTION_BITS)
        self._start(delta.shape)
        flat, out = delta.reshape(-1), self.total.reshape(-1)
        buf = np.empty(min(BLOCK, flat.size), np.float64)
        term = 0
        for start in range(0, flat.size, BLOCK):
            b = buf[: min(BLOCK, flat.size - start)]
            np.multiply(flat[start : start + b.size], scale, out=b, dtype=np.float64)
            np.rint(b, out=b)
            hi = max(float(b.max()), -float(b.min()))
            if not math.isfinite(hi):
                raise ValueError("an exact sum takes finite updates and weights only")
            term = max(term, int(hi))
            self._check(term)
            out[start : start + b.size] += b.astype(np.int64)
        self.bound += term
        self.terms += 1
        return self

    def merge(self, other: Partial) -> Partial:
        """Add another partial in place (exact); returns self."""
        if other.total is None:
            return self
        self._start(other.total.shape)
        self._check(other.bound)
        self.total += other.total
        self.bound += other.bound
        self.terms += other.terms
        return self

    def _start(self, shape: tuple[int, ...]) -> None:
        if self.total is None:
            self.total = np.zeros(shape, np.int64)
        elif self.total.shape != shape:
            raise ValueError(f"cannot sum updates of shapes {self.total.shape} and {shape}")

    def _check(self, more: int) -> None:
        """Refuse to add what reaches ``more`` to a sum bounded by ``bound``."""
        if self.bound + more >= LIMIT:
            reach = math.ldexp(self.bound + more, -FRACTION_BITS)
            raise SumOverflow(
                f"an exact sum of {self.terms + 1}+ weighted updates could reach {reach:.3g} in "
                f"one coordinate, past the {headroom():.3g} that {FRACTION_BITS} fraction bits "
                "leave in int64: the updates have diverged (lower the learning rate) or a "
                "weight is far from 1"
            )

    def value(self) -> np.ndarray:
        """The sum as float32 (``Σq·2^-s``, rounded once through float64)."""
        if self.total is None:
            raise ValueError("an empty sum has no shape")
        return np.ldexp(self.total.astype(np.float64), -FRACTION_BITS).astype(np.float32)

    @property
    def nbytes(self) -> int:
        return 0 if self.total is None else self.total.nbytes


def exact_sum(deltas: Sequence[np.ndarray], weights: Sequence[float]) -> Partial:
    """``Σ weights[j]·deltas[j]`` as a ``Partial`` (exact, independent of order)."""
    out = Partial()
    for d, w in zip(deltas, weights, strict=True):
        out.add(d, w)
    return out


class SumSource(Protocol):
    """Where held deltas live (a Ray pool's nodes): sums them there, or fetches one."""

    def partial(self, items: Sequence[tuple[HeldDelta, float]]) -> Partial:
        """``Σ w·Δ`` over ``items`` (each delta held by this source), summed where they are."""

    def fetch(self, delta: HeldDelta) -> np.ndarray:
        """The delta itself (a copy to this process)."""


class HeldDelta:
    """A client's delta left where it was computed (``workers.partial_sums``): what a strategy
    whose server step only sums its updates (``Strategy.sums_updates``) gets as
    ``Update.delta``. ``WeightedMean.combine`` sums it where it is; read as an array it refuses,
    naming the cause; in a checkpoint of a strategy's buffer (or pickled) it is fetched and
    written as the array it stands for."""

    __slots__ = ("source", "key", "shape", "nbytes", "node")

    def __init__(
        self, source: SumSource, key: Any, shape: tuple[int, ...], nbytes: int, node: str = ""
    ) -> None:
        """``key``: what ``source`` finds the delta by (a Ray object ref); ``node``: where."""
        self.source = source
        """Where it lives (a Ray pool's nodes), which sums it there or fetches it."""
        self.key = key
        """What ``source`` finds it by (a Ray object ref)."""
        self.shape = tuple(shape)
        """The delta's shape: that of the global vector."""
        self.nbytes = int(nbytes)
        """The delta's size in bytes."""
        self.node = node
        """The id of the node that holds it."""

    def fetch(self) -> np.ndarray:
        """The delta itself, copied to this process (what a checkpoint writes)."""
        return self.source.fetch(self)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            "this update's delta is held on its worker (workers.partial_sums), where only "
            "WeightedMean.combine sums it; a strategy that reads deltas must not set "
            "sums_updates (or run with workers.partial_sums=off)"
        )

    def __reduce__(self) -> Any:
        return self.fetch().__reduce__()

    def __checkpoint_value__(self) -> np.ndarray:
        """What a checkpoint writes for it (``raysim.state.codec``): the array, fetched."""
        return self.fetch()

    def __repr__(self) -> str:
        return f"HeldDelta(shape={self.shape}, node={self.node[:8]!r})"


class SumMechanism(Protocol):
    """What a sum is released through while one is in force (``mechanism``): differential
    privacy's noise, say (``raysim.privacy``). ``weights`` may change the weights a strategy
    gave (a fixed denominator); ``release`` turns the exact sum into what the strategy gets."""

    def weights(self, weights: Sequence[float]) -> list[float]: ...

    def release(self, total: np.ndarray, weights: Sequence[float]) -> np.ndarray: ...


_MECHANISM: ContextVar[SumMechanism | None] = ContextVar("raysim_sum_mechanism", default=None)


@contextmanager
def mechanism(m: SumMechanism | None) -> Iterator[None]:
    """Every ``combine`` inside releases its sum through ``m`` (None: as it is). A strategy
    whose ``sums_updates`` is True reads its clients' deltas only through ``combine``, so a
    mechanism wrapped around its hooks sees every sum it takes."""
    token = _MECHANISM.set(m)
    try:
        yield
    finally:
        _MECHANISM.reset(token)


def combine(deltas: Sequence[np.ndarray | HeldDelta], weights: Sequence[float]) -> np.ndarray:
    """``Σ weights[j]·deltas[j]`` as float32, exactly and in any order: arrays here, held deltas
    where they are (one partial per source); through the ``mechanism`` in force, if any."""
    m = _MECHANISM.get()
    if m is not None:
        weights = m.weights(weights)
    total = Partial()
    held: dict[int, tuple[SumSource, list[tuple[HeldDelta, float]]]] = {}
    for d, w in zip(deltas, weights, strict=True):
        if isinstance(d, HeldDelta):
            held.setdefault(id(d.source), (d.source, []))[1].append((d, float(w)))
        else:
            total.add(d, float(w))
    for source, items in held.values():
        total.merge(source.partial(items))
    return total.value() if m is None else m.release(total.value(), weights)
