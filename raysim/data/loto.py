"""Leave-one-task-out and leave-one-domain-out client splits (FedOA spec §4.2, §3.1 pooling)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from raysim.data.instructions import FAMILIES, TASK_FAMILY, TextExample

SHARD_TAG = 12  # rng = default_rng([seed, SHARD_TAG, crc32(task)]) for LOTO shards


@dataclass(frozen=True)
class LOTOSplit:
    """Leave-one-task-out clients and test sets (FedOA spec §4.2 items 1-3)."""

    held_out: str
    clients: list[list[TextExample]]  # train examples per client
    client_tasks: list[str]  # sub-dataset id per client
    ood_test: list[TextExample]  # held-out family's test examples (all its sub-datasets)
    id_test: list[list[TextExample]]  # each client's own sub-dataset test split


def _task_family(task: str, splits: dict[str, list[TextExample]]) -> str:
    families = {e.family for part in splits.values() for e in part}
    if len(families) > 1:
        raise ValueError(f"sub-dataset {task!r} mixes families {sorted(families)}")
    family = families.pop() if families else TASK_FAMILY.get(task)
    if family not in FAMILIES:
        raise ValueError(f"sub-dataset {task!r} has unknown family {family!r}")
    return family


def leave_one_task_out(
    tasks: dict[str, dict[str, list[TextExample]]],
    held_out: str,
    shards_per_task: int = 1,
    seed: int = 0,
) -> LOTOSplit:
    """Hold out one family; every other sub-dataset becomes 1 client or ``shards_per_task``
    disjoint random near-equal shards (FedOA spec §4.2 item 3, shards drawn from ``seed``)."""
    if held_out not in FAMILIES:
        raise ValueError(f"held_out must be one of {list(FAMILIES)}, got {held_out!r}")
    held = {t for t, splits in tasks.items() if _task_family(t, splits) == held_out}
    if not held:
        raise ValueError(f"no sub-dataset of the held-out family {held_out!r} was given")
    return _hold_out(tasks, held, held_out, shards_per_task, seed)


def task_domains(tasks: dict[str, dict[str, list[TextExample]]]) -> dict[str, str]:
    """Sub-dataset → domain label ``d1``, ``d2``, … : its rank among its family's sub-datasets
    (sorted ids; Flan-mini's ``*_d1``/``*_d2``, Flan's e.g. snli/anli)."""
    by_family: dict[str, list[str]] = {}
    for t, splits in tasks.items():
        by_family.setdefault(_task_family(t, splits), []).append(t)
    return {t: f"d{i + 1}" for ts in by_family.values() for i, t in enumerate(sorted(ts))}


def leave_one_domain_out(
    tasks: dict[str, dict[str, list[TextExample]]],
    held_out_domain: str,
    shards_per_task: int = 1,
    seed: int = 0,
) -> LOTOSplit:
    """Hold out one domain of every family (a text analogue of FedOA spec §4.2 item 4): the other
    domain's sub-datasets are the clients, the held-out domain's test splits the OOD set."""
    domains = task_domains(tasks)
    held = {t for t, d in domains.items() if d == held_out_domain}
    if not held:
        raise ValueError(
            f"held_out_domain must be one of {sorted(set(domains.values()))}, "
            f"got {held_out_domain!r}"
        )
    return _hold_out(tasks, held, held_out_domain, shards_per_task, seed)


def _hold_out(
    tasks: dict[str, dict[str, list[TextExample]]],
    held: set[str],
    label: str,
    shards_per_task: int,
    seed: int,
) -> LOTOSplit:
    if shards_per_task < 1:
        raise ValueError(f"shards_per_task must be >= 1, got {shards_per_task}")
    clients, client_tasks, ood, id_test = [], [], [], []
    for task, splits in tasks.items():
        if task in held:
            ood.extend(splits["test"])
            continue
        train = splits["train"]
        if len(train) < shards_per_task:
            raise ValueError(f"{task}: {len(train)} train examples < {shards_per_task} shards")
        rng = np.random.default_rng([seed, SHARD_TAG, zlib.crc32(task.encode())])
        perm = rng.permutation(len(train)) if shards_per_task > 1 else np.arange(len(train))
        for shard in np.array_split(perm, shards_per_task):
            clients.append([train[i] for i in np.sort(shard)])
            client_tasks.append(task)
            id_test.append(list(splits["test"]))
    if not clients:
        raise ValueError("every sub-dataset is held out; no clients remain")
    return LOTOSplit(label, clients, client_tasks, ood, id_test)


def pool_split(split: LOTOSplit) -> LOTOSplit:
    """All training clients merged into one (Centralized, FedOA spec §3.1).

    The one client holds every training example (client order kept) and its ID test set is the
    union of the training sub-datasets' test splits, each sub-dataset once (shards share theirs).
    """
    tasks = list(dict.fromkeys(split.client_tasks))
    id_test: list[TextExample] = []
    for task in tasks:
        id_test.extend(split.id_test[split.client_tasks.index(task)])
    pooled = [e for client in split.clients for e in client]
    return LOTOSplit(split.held_out, [pooled], ["+".join(tasks)], split.ood_test, [id_test])
