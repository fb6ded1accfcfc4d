"""Pure partition functions: split sample indices among federated clients.

Every function returns ``list[np.ndarray]``: one sorted int64 index array per client.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from raysim.schema import StrictModel

MAX_DIRICHLET_DRAWS = 1000


class PartitionConfig(StrictModel):
    """How the training set is split among clients."""

    kind: Literal[
        "iid", "dirichlet", "shards", "natural", "contiguous", "iid_balanced", "class_subset"
    ] = Field(
        "dirichlet",
        description="iid: shuffled, equal sizes; dirichlet: each class split by Dir(alpha) "
        "shares (label skew, Hsu et al. 2019); shards: label-sorted shards dealt out (McMahan et "
        "al. 2017); natural: one client per id of the source's client column; contiguous: "
        "consecutive blocks in data order; iid_balanced: every client holds every class in "
        "equal numbers; class_subset: classes_per_client classes each",
    )
    alpha: float = Field(
        0.3, gt=0, description="dirichlet: the concentration; small (0.1) is very skewed"
    )
    shards_per_client: int = Field(2, ge=1, description="shards: shards each client gets")
    classes_per_client: int = Field(
        2, ge=1, description="class_subset: classes each client holds (FedBaF spec §4.2)"
    )
    min_size: int = Field(
        1, ge=0, description="dirichlet: redraw until every client has at least this many samples"
    )
    natural_clients: Literal["all", "sample"] = Field(
        "all",
        description="natural: every id is a client (num clients must match), or keep num "
        "clients drawn at random and drop the rest (LEAF, Feddle spec §5.2)",
    )


def _check_clients(n: int, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > n:
        raise ValueError(
            f"num_clients ({num_clients}) exceeds the number of training samples ({n})"
        )


def _sorted_parts(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(p).astype(np.int64) for p in parts]


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``range(n)`` and cut it into ``num_clients`` parts whose sizes differ by <= 1."""
    _check_clients(n, num_clients)
    return _sorted_parts(np.array_split(rng.permutation(n), num_clients))


def contiguous(n: int, num_clients: int) -> list[np.ndarray]:
    """Consecutive blocks in data order, sizes differing by <= 1 (a corpus's sequential grouping,
    FedBaF spec §4.2)."""
    _check_clients(n, num_clients)
    return _sorted_parts(np.array_split(np.arange(n), num_clients))


def class_subset(
    labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """FedBaF spec §4.2: each client holds ``per_client`` distinct classes with the same number of
    samples of each; holders of a class share its rows without overlap. Client ``j`` holds
    ``perm[(j·k + i) mod C]`` for a random class order ``perm``, so every class has ⌊K·k/C⌋ or
    ⌈K·k/C⌉ holders (the spec's placeholder: random subsets covering every class). The count per
    class is the largest every holder can get; the remainder is dropped. ``per_client = C`` is the
    IID equal-per-class partition (``iid_balanced``)."""
    classes = np.unique(labels)
    if per_client > len(classes):
        raise ValueError(f"classes_per_client {per_client} exceeds the {len(classes)} classes")
    _check_clients(len(labels), num_clients)
    perm = rng.permutation(classes)
    held = [
        [perm[(j * per_client + i) % len(classes)] for i in range(per_client)]
        for j in range(num_clients)
    ]
    holders = {c: [j for j in range(num_clients) if c in held[j]] for c in classes}
    rows = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    share = min(len(rows[c]) // len(h) for c, h in holders.items() if h)
    if share == 0:
        raise ValueError("too few samples: some client would get no sample of a class it holds")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, h in holders.items():
        for i, j in enumerate(h):
            parts[j].append(rows[c][i * share : (i + 1) * share])
    return _sorted_parts([np.concatenate(p) for p in parts])


def _dirichlet_draw(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """One draw: every class is split among clients with proportions ~ Dir(alpha)."""
    buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        props = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
        for j, chunk in enumerate(np.split(idx, cuts)):
            buckets[j].append(chunk)
    return _sorted_parts([np.concatenate(b) for b in buckets])


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Label-skewed partition (Hsu et al. 2019); redraws until every client has >= min_size."""
    labels = np.asarray(labels)
    n = len(labels)
    _check_clients(n, num_clients)
    if min_size * num_clients > n:
        raise ValueError(
            f"dirichlet partition cannot give {num_clients} clients min_size={min_size} "
            f"samples each from only {n} samples"
        )
    for _ in range(MAX_DIRICHLET_DRAWS):
        parts = _dirichlet_draw(labels, num_clients, alpha, rng)
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise ValueError(
        f"dirichlet partition (alpha={alpha}) could not give every one of {num_clients} "
        f"clients min_size={min_size} samples after {MAX_DIRICHLET_DRAWS} draws; "
        "raise alpha, lower min_size or use fewer clients"
    )


def shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Sort by label, cut into ``num_clients*shards_per_client`` equal shards, deal them out."""
    labels = np.asarray(labels)
    n = len(labels)
    _check_clients(n, num_clients)
    num_shards = num_clients * shards_per_client
    if num_shards > n:
        raise ValueError(
            f"shards partition needs {num_shards} shards ({num_clients} clients x "
            f"{shards_per_client}) but there are only {n} training samples"
        )
    shuffled = rng.permutation(n)  # random order within each label
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(by_label, num_shards)
    owner = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return _sorted_parts([np.concatenate([pieces[s] for s in row]) for row in owner])


def natural(ids: np.ndarray) -> list[np.ndarray]:
    """One client per distinct natural id (e.g. writer or user), ordered by sorted id."""
    ids = np.asarray(ids)
    if ids.dtype == object:
        ids = ids.astype(str)
    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    order = np.argsort(inverse.ravel(), kind="stable")
    return _sorted_parts(np.split(order, np.cumsum(counts)[:-1]))


def pack(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate per-client index arrays into ``(indices, offsets)`` (CSR layout)."""
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    return indices, offsets


def partition(
    cfg: PartitionConfig,
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    ids: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Dispatch on ``cfg.kind``; ``ids`` are the natural client ids (natural kind only)."""
    if cfg.kind == "iid":
        return iid(len(labels), num_clients, rng)
    if cfg.kind == "dirichlet":
        return dirichlet(labels, num_clients, cfg.alpha, rng, cfg.min_size)
    if cfg.kind == "shards":
        return shards(labels, num_clients, cfg.shards_per_client, rng)
    if cfg.kind == "contiguous":
        return contiguous(len(labels), num_clients)
    if cfg.kind == "iid_balanced":
        return class_subset(labels, num_clients, len(np.unique(labels)), rng)
    if cfg.kind == "class_subset":
        return class_subset(labels, num_clients, cfg.classes_per_client, rng)
    if ids is None:
        raise ValueError("natural partition needs per-sample client ids (hf.client_column)")
    parts = natural(ids)
    if cfg.natural_clients == "sample" and len(parts) > num_clients:
        keep = np.sort(rng.permutation(len(parts))[:num_clients])
        parts = [parts[i] for i in keep]
    if len(parts) != num_clients:
        raise ValueError(
            f"natural partition found {len(parts)} distinct client ids in the training split "
            f"but num_clients={num_clients}; set num_clients={len(parts)}"
        )
    return parts
