"""What the server side of a method may compute with: ``ServerContext`` (``Strategy.setup``).

The coordinator builds one per run (fresh or resumed) and hands it to the strategy and to every
post-aggregation mixer. It holds named random streams derived from the run seed, the layout of the
global vector, a way to build the resident model and its task on the server's device, the server's
own data (Feddle spec §7.1 item 6) and a sink for server-only metrics.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..models.layout import SHARED, Layout
from ..models.registry import resolve_device
from ..training.settings import LocalTrainingConfig

if TYPE_CHECKING:  # a server that computes in numpy loads no torch
    import torch

    from ..models.handle import ModelHandle
    from ..training.tasks import Task

SERVER_STREAM = 0x5E7E
"""The tag that keeps the server's streams apart from every other stream of the run seed."""


@dataclass(frozen=True)
class ServerPool:
    """Labelled server data in the clients' format: ``data`` is what a ``Task`` consumes.

    ``num_classes`` is the pool's own label space (an OOD pool's labels need not be the clients').
    """

    data: Any
    """The pool's rows as a ``Task`` takes them: ``(inputs, labels)``, or a dict of tokens."""
    num_classes: int
    """The size of the pool's label space."""

    def __len__(self) -> int:
        return len(self.data[1]) if isinstance(self.data, tuple) else len(self.data["input_ids"])


@dataclass(frozen=True)
class ServerData:
    """``id``: the in-distribution split carved from the test split (``data.server.id_size``);
    ``ood``: out-of-distribution pools by name."""

    id: ServerPool | None = None
    """The in-distribution pool, or None where ``data.server.id_size`` is 0."""
    ood: Mapping[str, ServerPool] = field(default_factory=dict)
    """The out-of-distribution pools by name (``data.server.ood``)."""


class ServerContext:
    """The server's resources for one run, given to ``Strategy.setup`` and ``Mixer.setup``.
    Everything here stays in the coordinator's process.

    Randomness: ``rng(name)`` / ``torch_generator(name)``, named streams of the run seed (keep
    a generator on the strategy: it is checkpointed, so a resume continues it). The vector:
    ``layout``. Compute: ``model()`` (the resident model and its task on ``device``), ``data``
    (the server's own data), ``local`` (the clients' training recipe). Metrics: ``log``.
    """

    def __init__(
        self,
        seed: int,
        layout: Layout,
        num_clients: int,
        *,
        client_sizes: np.ndarray | None = None,
        data: ServerData | None = None,
        local: LocalTrainingConfig | None = None,
        model_factory: Callable[[], tuple[ModelHandle, Task]] | None = None,
        log: Callable[[str, float], None] | None = None,
        clients_per_round: int | None = None,
    ) -> None:
        self.seed = seed
        """The run seed (draw from ``rng`` or ``torch_generator``, not from it directly)."""
        self.clients_per_round = clients_per_round
        """S, the clients dispatched per round (None where the run does not say)."""
        self.layout = layout
        """Names, shapes and groups of the global vector (``Layout``): the shared parameters,
        then the buffers."""
        self.num_clients = num_clients
        """K, the number of clients in the run."""
        self.client_sizes = client_sizes
        """Each client's number of training examples, by client id (None where not given)."""
        self.data = data or ServerData()
        """The server's own data (``data.server``): ``data.id`` and ``data.ood[name]``."""
        self.local = local or LocalTrainingConfig()
        """The clients' local-training settings (the config's ``local`` section), for a server
        that trains as they do."""
        self._model_factory = model_factory
        self._model: tuple[ModelHandle, Task] | None = None
        self._log = log

    @classmethod
    def minimal(cls, seed: int, size: int, num_clients: int) -> ServerContext:
        """A context for a bare vector of ``size`` values (tests, benchmarks)."""
        return cls(seed, Layout([("weights", (size,), SHARED)]), num_clients)

    # ----------------------------------------------------------------- randomness
    def stream_seed(self, name: str) -> int:
        """A seed for the named server stream: a function of (run seed, name) only."""
        ss = np.random.SeedSequence([self.seed, SERVER_STREAM, zlib.crc32(name.encode())])
        return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))

    def rng(self, name: str) -> np.random.Generator:
        """A numpy generator for one named purpose (keep it on the strategy: it is resumed)."""
        return np.random.default_rng(self.stream_seed(name))

    def torch_generator(self, name: str) -> torch.Generator:
        """A torch generator (CPU) for one named purpose, seeded as ``rng(name)`` is."""
        import torch

        return torch.Generator().manual_seed(self.stream_seed(name))

    # ----------------------------------------------------------------- compute
    @property
    def device(self) -> torch.device:
        """Where server-side vector work runs: the coordinator's GPU when it has one
        (``coordinator.num_gpus``), else the CPU."""
        return resolve_device("auto")

    @property
    def has_model(self) -> bool:
        """Whether ``model()`` can build a model (a context from ``minimal`` cannot)."""
        return self._model_factory is not None

    def model(self) -> tuple[ModelHandle, Task]:
        """The resident model and its task on the server's device (built on first use)."""
        if self._model is None:
            if self._model_factory is None:
                raise RuntimeError("this run gives the server no model to compute with")
            self._model = self._model_factory()
        return self._model

    # ----------------------------------------------------------------- metrics
    def log(self, name: str, value: float) -> None:
        """A server-only metric of the current round (logged with the round's metrics)."""
        if self._log is not None:
            self._log(name, float(value))
