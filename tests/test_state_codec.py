"""Run state as JSON and arrays (``raysim.state.codec``): what comes back is what went in, and
nothing a checkpoint names can make decoding run code."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
import torch

from raysim.algorithms.base import Update
from raysim.state.codec import StateCodecError, decode, encode, state_type


@state_type
@dataclasses.dataclass(frozen=True)
class Moment:
    step: int
    values: np.ndarray


def _roundtrip(obj):
    arrays: dict[str, np.ndarray] = {}
    tree = json.loads(json.dumps(encode(obj, arrays)))  # through text, as a checkpoint goes
    return decode(tree, arrays)


def test_every_kind_of_state_comes_back_equal() -> None:
    rng = np.random.default_rng(7)
    rng.random(3)
    pyrng = random.Random(4)
    state = {
        "ints": {1: "a", 2: (3, 4.5)},
        "__dunder__": None,
        "nested": [{"a": np.arange(4, dtype=np.int64)}, np.float32(1.5), np.int64(-3)],
        "scalar_array": np.array(2.5),
        "strings": np.array(["x", "yz"]),
        "set": {3, 1},
        "bytes": b"\x00\x01",
        "nan": float("nan"),
        "rng": rng,
        "pyrng": pyrng,
        "bf16": torch.arange(3, dtype=torch.bfloat16),
        "update": Update(
            client_id=1,
            delta=np.ones(2, np.float32),
            num_samples=5,
            dispatch_round=0,
            dispatch_version=0,
            arrival_time=0.5,
            arrival_round=1,
            tau_versions=1,
            base=np.zeros(2, np.float32),
            extras={"e": np.ones(1)},
        ),  # fmt: skip
        "moment": Moment(3, np.zeros(2)),
    }
    back = _roundtrip(state)
    assert back["ints"] == {1: "a", 2: (3, 4.5)} and "__dunder__" in back
    np.testing.assert_array_equal(back["nested"][0]["a"], np.arange(4))
    assert type(back["nested"][1]) is np.float32 and back["nested"][2] == -3
    assert back["scalar_array"].shape == () and float(back["scalar_array"]) == 2.5
    assert back["strings"].tolist() == ["x", "yz"] and back["set"] == {1, 3}
    assert back["bytes"] == b"\x00\x01" and np.isnan(back["nan"])
    assert back["rng"].random() == rng.random()  # same position in the stream
    assert back["pyrng"].random() == pyrng.random()
    assert back["bf16"].dtype == torch.bfloat16 and back["bf16"].tolist() == [0.0, 1.0, 2.0]
    assert isinstance(back["update"], Update) and back["update"].num_samples == 5
    np.testing.assert_array_equal(back["update"].local_weights, np.ones(2))
    assert isinstance(back["moment"], Moment) and back["moment"].step == 3


def test_what_cannot_be_stored_is_refused_by_name() -> None:
    class Opaque:
        pass

    with pytest.raises(StateCodecError, match=r"strategy/thing: a .*Opaque cannot be"):
        encode({"strategy": {"thing": Opaque()}}, {})
    with pytest.raises(StateCodecError, match="dtype object"):
        encode(np.array([object()]), {})


def test_a_checkpoint_cannot_name_a_type_outside_raysim() -> None:
    """Decoding builds only raysim's dataclasses and registered ones; a crafted entry naming
    another module's callable is refused, and the module is never imported."""
    import sys

    crafted = {"__type__": "subprocess.Popen", "fields": {"args": ["touch", "/tmp/x"]}}
    with pytest.raises(StateCodecError, match="has not registered"):
        decode(crafted, {})
    crafted = {"__type__": "antigravity.fly", "fields": {}}
    with pytest.raises(StateCodecError):
        decode(crafted, {})
    assert "antigravity" not in sys.modules
    with pytest.raises(StateCodecError, match="unknown entry"):
        decode({"__reduce__": 1}, {})


def test_raysims_own_objects_come_back_and_private_ones_never_go_in() -> None:
    from raysim.algorithms.private import PrivateTensors
    from raysim.sim.clock import PendingJob

    job = PendingJob(**{f.name: 1 for f in dataclasses.fields(PendingJob)})
    assert _roundtrip({"job": job})["job"] == job
    secret = PrivateTensors({"w": np.ones(3, np.float32)})
    with pytest.raises(StateCodecError):
        encode({"strategy": {"secret": secret}}, {})
    with pytest.raises(StateCodecError, match="private"):
        encode({"strategy": {"slice": secret["w"][:2]}}, {})


def test_a_class_with_a_finaliser_is_never_built_from_a_checkpoint(monkeypatch) -> None:
    """A finaliser would act on attributes the checkpoint wrote (a path to delete, say)."""
    import raysim.sim.clock as clock

    crafted = {"__type__": "raysim.sim.clock.PendingJob", "fields": {}}
    monkeypatch.setattr(clock.PendingJob, "__del__", lambda self: None, raising=False)
    with pytest.raises(StateCodecError, match="has not registered"):
        decode(crafted, {})
