"""Server-private tensors: state that must never reach a worker, a payload or a pickle.

FedBaF's foundation weights are the case in point (FedBaF spec §2.8, §7.1): a client function that
captured the server object would be cloudpickled *with* them. ``PrivateTensors`` refuses to be
pickled at all, so such a leak fails at once instead of silently shipping the weights, and the
default ``Strategy.state_dict`` leaves it out of checkpoints: a strategy rebuilds it in ``setup``
(from the config, on the server), or persists it explicitly through ``Strategy.private_state``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


class PrivateStateError(RuntimeError):
    """Private server state was about to be serialised (sent to a worker or pickled)."""


REFUSAL = (
    "server-private tensors cannot be serialised: keep them on the server (rebuild them in "
    "Strategy.setup, or persist them through Strategy.private_state)"
)
"""The message of every refusal to serialise server-private state."""


class PrivateArray(np.ndarray):
    """A read-only array that refuses to be pickled: a server-private tensor handed out of
    ``PrivateTensors`` (or a ``Secret``'s values) stays private when a closure captures the
    array itself rather than its holder. Views, slices and copies (``astype``) keep the type;
    arithmetic gives plain arrays (a model mixed with a secret is the server's to send: the
    leak auditor judges those), and so do ``np.ascontiguousarray`` and ``np.asarray(...,
    subok=False)``, for the server's own deliberate writes (``private/foundation.safetensors``)."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):  # noqa: D105
        plain = [x.view(np.ndarray) if isinstance(x, PrivateArray) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(
                x.view(np.ndarray) if isinstance(x, PrivateArray) else x for x in kwargs["out"]
            )
        return getattr(ufunc, method)(*plain, **kwargs)

    def __reduce__(self):  # noqa: D105
        raise PrivateStateError(REFUSAL)

    def __reduce_ex__(self, protocol):  # noqa: D105
        return self.__reduce__()


def private_array(values: np.ndarray) -> PrivateArray:
    """A read-only ``PrivateArray`` copy of ``values``."""
    out = np.array(values, copy=True).view(PrivateArray)
    out.flags.writeable = False
    return out


class PrivateTensors(Mapping[str, np.ndarray]):
    """A read-only name → array mapping that cannot be pickled, copied by Ray or checkpointed;
    its arrays (``PrivateArray``) refuse to be pickled as well."""

    __slots__ = ("_arrays",)

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        frozen = {name: private_array(value) for name, value in arrays.items()}
        object.__setattr__(self, "_arrays", frozen)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        return f"PrivateTensors({len(self._arrays)} tensors, contents withheld)"

    def __reduce__(self):  # noqa: D105 - pickle, cloudpickle, copy and Ray all come through here
        raise PrivateStateError(REFUSAL)

    def __reduce_ex__(self, protocol):  # noqa: D105
        return self.__reduce__()


class PrivateDeviceTensors(PrivateTensors):
    """``PrivateTensors`` of torch tensors (server-side compute on the coordinator's device):
    copied on construction, and refused by pickle like the arrays."""

    __slots__ = ()

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        object.__setattr__(self, "_arrays", {n: t.detach().clone() for n, t in tensors.items()})
