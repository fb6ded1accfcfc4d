"""Run state as JSON and arrays, never pickles: what a checkpoint stores, and only that.

``encode`` turns a nested state (dicts, lists, tuples, numbers, strings, numpy arrays and
scalars, torch tensors, numpy and ``random`` generators, objects of raysim's own classes and of
those registered with ``state_type``) into a JSON-able tree whose arrays are collected apart
(for a safetensors file); ``decode`` rebuilds it. Decoding creates only those types, by setting
their attributes (never calling a constructor or ``__setstate__``): a checkpoint names a class
of raysim's or a registered one, never a module of its choosing, so a crafted checkpoint cannot
run code (a pickle can). A value whose class refuses pickling (raysim's private arrays) refuses
this too. Anything else is refused when the checkpoint is written, naming where it is.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import random
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

#: numpy dtypes a safetensors file holds.
ARRAY_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64".split()
)
_BIT_GENERATORS = {c.__name__: c for c in (np.random.PCG64, np.random.PCG64DXSM,
                                            np.random.Philox, np.random.MT19937,
                                            np.random.SFC64)}  # fmt: skip
_TYPES: dict[str, type] = {}
T = TypeVar("T", bound=type)
#: Modules that earlier releases' checkpoints name classes by and that have moved since (with
#: the top of raysim/ into packages: ``raysim/_moved.py``, whose import aliases go with the next
#: release): their classes are read at the new path, so such checkpoints keep resuming.
RENAMED_MODULES = {
    "raysim.state_store": "raysim.state.store",  # StoredState: personal state on disk
    "raysim.clock": "raysim.sim.clock",
    "raysim.delays": "raysim.sim.delays",
}


class StateCodecError(TypeError):
    """A value that a checkpoint cannot hold, or a checkpoint that names an unknown type."""


def state_type(cls: T) -> T:
    """Register a class that run state may hold (``Strategy.state_dict()`` of a plugin, say):
    checkpoints store its fields (a dataclass's) or attributes and rebuild it by this
    registration alone, without calling its ``__init__``."""
    _TYPES[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return cls


def _tag(node: Any) -> str | None:
    if isinstance(node, dict) and len(node) >= 1:
        first = next(iter(node))
        if isinstance(first, str) and first.startswith("__") and first.endswith("__"):
            return first
    return None


def encode(obj: Any, arrays: dict[str, np.ndarray], path: str = "") -> Any:
    """``obj`` as a JSON-able tree; arrays go to ``arrays`` under their path."""
    if not path:
        try:
            return _encode(obj, arrays, path)
        except RecursionError:
            raise StateCodecError("state too deep to checkpoint (a cycle?)") from None
    return _encode(obj, arrays, path)


def _encode(obj: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode(v, arrays, f"{path}/{k}") for k, v in obj.items()}
        return {"__map__": [[encode(k, arrays, f"{path}/key"), encode(v, arrays, f"{path}/{k}")]
                            for k, v in obj.items()]}  # fmt: skip
    if isinstance(obj, list):
        return [encode(v, arrays, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, arrays, f"{path}/{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, (set, frozenset)):
        items = sorted(obj, key=repr)
        return {"__set__": [encode(v, arrays, path) for v in items], "frozen": isinstance(
            obj, frozenset)}  # fmt: skip
    if isinstance(obj, np.ndarray):
        if _refuses_pickling(obj):  # a private array (``PrivateArray``): never in a checkpoint
            raise StateCodecError(f"{path or 'state'}: a {type(obj).__name__} is private")
        return _encode_array(obj, arrays, path)
    if isinstance(obj, np.generic):
        return {"__np__": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, bytes):
        return {"__bytes__": base64.b64encode(obj).decode()}
    if isinstance(obj, np.random.Generator):
        bits = obj.bit_generator
        return {"__rng__": type(bits).__name__, "state": encode(bits.state, arrays, path)}
    if isinstance(obj, random.Random):
        return {"__random__": encode(obj.getstate(), arrays, path)}
    if type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "numpy"):
        return _encode_tensor(obj, arrays, path)
    stand_in = getattr(type(obj), "__checkpoint_value__", None)
    if stand_in is not None:  # a handle written as what it stands for (``HeldDelta``: its array)
        return _encode(stand_in(obj), arrays, path)
    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if _known(name) is type(obj) and not _refuses_pickling(obj):
        fields = {k: encode(v, arrays, f"{path}/{k}") for k, v in _attributes(obj).items()}
        return {"__type__": name, "fields": fields}
    raise StateCodecError(
        f"{path or 'state'}: a {name} cannot be checkpointed (arrays, numbers, strings, lists, "
        "dicts, tuples, generators, raysim's own objects and classes registered with "
        "raysim.state.codec.state_type can); convert it in state_dict() or register its class"
    )


def _key(arrays: Mapping[str, np.ndarray], path: str) -> str:
    key = path or "/"
    while key in arrays:  # e.g. keys 1 and "1" side by side
        key += "'"
    return key


def _encode_array(a: np.ndarray, arrays: dict[str, np.ndarray], path: str) -> Any:
    if a.dtype.name in ARRAY_DTYPES:
        key = _key(arrays, path)
        arrays[key] = np.ascontiguousarray(a.reshape(-1) if a.ndim == 0 else a)
        return {"__array__": key, "scalar": a.ndim == 0}
    if a.dtype.kind in "US":  # strings: small (names, labels)
        return {"__strings__": a.dtype.str, "values": a.tolist()}
    raise StateCodecError(f"{path or 'state'}: an array of dtype {a.dtype} cannot be checkpointed")


def _encode_tensor(t: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    import torch

    t = t.detach().cpu().contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:  # no numpy bfloat16: its bits, as uint16
        values = t.view(torch.int16).numpy().view(np.uint16)
    else:
        values = t.numpy()
    return {"__torch__": dtype, "array": _encode_array(values, arrays, path)}


def decode(node: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The state ``encode`` made of ``node``; ``arrays`` as read back from safetensors."""
    if isinstance(node, list):
        return [decode(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    tag = _tag(node)
    if tag is None:
        return {k: decode(v, arrays) for k, v in node.items()}
    handler = _DECODERS.get(tag)
    if handler is None:
        raise StateCodecError(f"checkpoint: unknown entry {tag!r} (written by a newer raysim?)")
    return handler(node, arrays)


def _array(node: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    a = arrays[node["__array__"]]
    return a.reshape(()) if node.get("scalar") else a


def _refuses_pickling(obj: Any) -> bool:
    """Whether ``obj``'s class overrides ``__reduce__``: raysim's private values do, to refuse
    pickling (``raysim.algorithms.private``); they refuse a checkpoint alike."""
    base = np.ndarray if isinstance(obj, np.ndarray) else object
    cls = type(obj)
    return cls.__reduce__ is not base.__reduce__ or cls.__reduce_ex__ is not base.__reduce_ex__


def _attributes(obj: Any) -> dict[str, Any]:
    """A dataclass's fields, or an object's attributes (``__dict__`` and ``__slots__``)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    out = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                out[slot] = getattr(obj, slot)
    return out


def _known(name: str) -> type | None:
    """A registered type, or a class of raysim's own (importing raysim's modules runs no code
    but raysim's: a checkpoint cannot name anything else), by its module's path now
    (``RENAMED_MODULES``)."""
    if name in _TYPES:
        return _TYPES[name]
    module, _, qualname = name.rpartition(".")
    while module.startswith("raysim.") and module:
        try:
            obj: Any = importlib.import_module(RENAMED_MODULES.get(module, module))
        except ImportError:
            module, _, head = module.rpartition(".")
            qualname = f"{head}.{qualname}"
            continue
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        # a finaliser would act on what the checkpoint wrote into the object: never built
        return obj if isinstance(obj, type) and not hasattr(obj, "__del__") else None
    return None


def _object(node: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    cls = _known(node["__type__"])
    if cls is None:
        raise StateCodecError(
            f"checkpoint holds a {node['__type__']}, a type this process has not registered "
            "(raysim.state.codec.state_type in the module that defines it)"
        )
    obj = object.__new__(cls)
    for name, value in node["fields"].items():
        object.__setattr__(obj, name, decode(value, arrays))
    return obj


def _rng(node: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> np.random.Generator:
    bits = _BIT_GENERATORS.get(node["__rng__"])
    if bits is None:
        raise StateCodecError(f"checkpoint: unknown bit generator {node['__rng__']!r}")
    gen = np.random.Generator(bits())
    gen.bit_generator.state = decode(node["state"], arrays)
    return gen


def _random(node: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> random.Random:
    r = random.Random()
    r.setstate(decode(node["__random__"], arrays))
    return r


def _tensor(node: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    import torch

    values = decode(node["array"], arrays)
    if node["__torch__"] == "bfloat16":
        return torch.from_numpy(values.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(values, copy=True))


_DECODERS: dict[str, Callable[[Mapping[str, Any], Mapping[str, np.ndarray]], Any]] = {
    "__array__": _array,
    "__map__": lambda n, a: {decode(k, a): decode(v, a) for k, v in n["__map__"]},
    "__tuple__": lambda n, a: tuple(decode(v, a) for v in n["__tuple__"]),
    "__set__": lambda n, a: (frozenset if n.get("frozen") else set)(
        decode(v, a) for v in n["__set__"]
    ),
    "__np__": lambda n, a: np.dtype(n["__np__"]).type(n["value"]),
    "__bytes__": lambda n, a: base64.b64decode(n["__bytes__"]),
    "__strings__": lambda n, a: np.array(n["values"], dtype=n["__strings__"]),
    "__rng__": _rng,
    "__random__": _random,
    "__torch__": _tensor,
    "__type__": _object,
}
