"""A user's method module that leaks on purpose (``algorithm.module``), for the leak auditor.

``leaky`` is FedAvg with a server-private block: 512 values drawn in ``setup`` from a named
server stream, declared in ``secrets()`` at the coordinates 0–511 of the global vector. Every
round it sends a transformed copy of the block with ``configure()`` (``transform``), or, with
``transform: none``, an unrelated draw of the same distribution in every float dtype (which must
pass). ``transform: cycle`` sends each of them in turn, a round each.
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.algorithms import Method, MethodParams, register
from raysim.algorithms.base import Downlink, Secret
from raysim.algorithms.general.fedavg import FedAvg
from raysim.algorithms.private import PrivateTensors

SIZE = 512
#: the block as a matrix (its values in row-major order), for the transposed leaks
SHAPE = (16, 32)
#: ``transform: cycle`` sends these in turn, one a round, an unrelated draw between any two
CYCLE = [
    name
    for leak in (
        "exact", "fp16", "bf16", "fp16_own", "bf16_own", "fp64", "scaled", "shifted", "reversed",
        "permuted", "split", "window", "fp16_of_scaled", "window_scaled", "window_bf16",
        "elsewhere_fp16", "permuted_half", "permuted_inside", "scattered_inside",
        "transposed_bf16", "transposed_inside", "transposed_bf16_inside",
    )
    for name in (leak, "none")
]  # fmt: skip


def bf16(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)


class LeakyParams(MethodParams):
    transform: str = "none"


class Leaky(FedAvg):
    params: LeakyParams
    transient = ("secret",)

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.size = ctx.layout.size
        draw = ctx.rng("leaky/secret").normal(0.0, 0.1, SIZE).astype(np.float32)
        self.secret = PrivateTensors({"w": draw})
        self.noise = ctx.rng("leaky/noise")

    def secrets(self) -> list[Secret]:
        return [Secret("private.block", np.arange(SIZE), np.array(self.secret["w"]), SHAPE)]

    def own(self, values: np.ndarray) -> np.ndarray:
        """The global weights with ``values`` at the block's coordinates."""
        out = np.array(self.weights, dtype=np.float32, copy=True)
        out[:SIZE] = values
        return out

    def configure(self, round_index, clients):
        s = np.array(self.secret["w"])
        half = SIZE // 2
        t = s.reshape(SHAPE).T.reshape(-1)  # the block's transpose, flat
        sends = {
            "exact": lambda: {"x": s.copy()},
            "fp16": lambda: {"x": s.astype(np.float16)},
            "bf16": lambda: {"x": bf16(s)},
            "fp16_own": lambda: {"x": self.own(s.astype(np.float16).astype(np.float32))},
            "bf16_own": lambda: {"x": self.own(bf16(s).float().numpy())},
            "fp64": lambda: {"x": s.astype(np.float64)},
            "scaled": lambda: {"x": s * np.float32(2.0)},
            "shifted": lambda: {"x": s + np.float32(0.25)},
            "reversed": lambda: {"x": s[::-1].copy()},
            "permuted": lambda: {"x": self.noise.permutation(s)},
            "split": lambda: {"a": s[:half].copy(), "b": s[half:].copy()},
            "window": lambda: {"x": np.concatenate([np.ones(7, np.float32), s])},
            "window_scaled": lambda: {"x": self.inside(s[100:300] * np.float32(2) + 0.1)},
            "window_bf16": lambda: {"x": self.inside(bf16(s[:128]).float().numpy())},
            "elsewhere_fp16": lambda: {"x": self.own_at(700, s.astype(np.float16))},
            "fp16_of_scaled": lambda: {"x": (s * np.float32(3.0) - 1).astype(np.float16)},
            "permuted_half": lambda: {"x": self.noise.permutation(s[:half])},
            "permuted_inside": lambda: {"x": self.inside(self.noise.permutation(s[100:300]))},
            "scattered_inside": lambda: {"x": self.inside(self.noise.choice(s, 128, False))},
            "transposed_bf16": lambda: {"x": bf16(t)},
            "transposed_inside": lambda: {"x": self.inside(t * np.float32(0.5) + np.float32(0.1))},
            "transposed_bf16_inside": lambda: {"x": self.inside(bf16(t[:200]).float().numpy())},
            "none": lambda: self.unrelated(),
        }
        name = self.params.transform
        if name == "cycle":  # round r: CYCLE[r], for one run that shows every class
            name = CYCLE[round_index % len(CYCLE)]
        return Downlink(sends[name]())

    def inside(self, values: np.ndarray) -> np.ndarray:
        """``values`` at position 1000 of a 3000-value draw of the block's distribution."""
        out = self.noise.normal(0.0, 0.1, 3000).astype(np.float32)
        out[1000 : 1000 + len(values)] = values
        return out

    def own_at(self, offset: int, values: np.ndarray) -> np.ndarray:
        """The global weights with ``values`` at other coordinates, from ``offset`` on."""
        out = np.array(self.weights, dtype=np.float32, copy=True)
        out[offset : offset + len(values)] = values
        return out

    def unrelated(self) -> dict:
        """A fresh draw of the block's distribution, whole and halved, in every dtype."""
        x = self.noise.normal(0.0, 0.1, SIZE).astype(np.float32)
        return {
            "f32": x,
            "f16": x.astype(np.float16),
            "bf16": bf16(x),
            "f64": x.astype(np.float64),
            "half": self.noise.permutation(x[: SIZE // 2]),
            "own": self.own(x),
        }


METHOD = register(
    Method(name="leaky", strategy=Leaky, params=LeakyParams, reference="tests (leak auditor)")
)
