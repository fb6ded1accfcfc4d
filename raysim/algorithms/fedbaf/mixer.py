"""FedBaF's mixing (FedBaF spec §2.2, Alg. 1 lines 9–11) as a post-aggregation mixer on any base.

After the base strategy produced ``w'`` from ``w_t``:

    r_t = ‖ w'/‖w'‖ − w_t/‖w_t‖ ‖,   τ_t = r_t / sqrt(t+1),   τ_0 kept from the first call
    α_t = (ψ/τ_0)·u_t, u_t ~ U(1, 2) from a server-only stream,   c_t = α_t τ_t
    w_{t+1} = (w' + c_t·w_pre) / (1 + c_t)      on matched coordinates only; the rest stay w'

The mix runs in torch float32 on the server's device (``ServerContext.device``: the coordinator's
GPU when it has one), as §8.2 asks, within 1e-6 of the weights' scale of the float64 numpy form it
replaced (``mix_float64``, kept as the reference); r_t is accumulated in float64 there
(``unit_distance``), within 1e-9 relative of ``r_float64`` down to r_t = 1e-5
(``tests/test_fedbaf.py``). τ_0 comes from the first
round whose τ_t is above 1e-12, c_t = 0 before it (``tau0_from``; the spec's floor at round 0 would
make c_t ≈ 1e12·τ_t after a round-0 aggregate that did not move), and a zero vector normalises to
zero (§2.5). ``tau_scope`` picks the vector of the norms (§2.4 (c));
``rng`` is ``seeded`` (reproducible, resumed with the run) or ``secure`` (OS entropy, deliberately
not reproducible, §2.5). The foundation weights are read from ``foundation`` (a safetensors file or
a directory holding ``model.safetensors``) in the server's process only, and held as
``PrivateTensors``, which refuse to be pickled, so they never reach a Ray payload or a
checkpoint. r_t, τ_t, u_t, α_t and c_t are logged on the server (§7.1) and never sent.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...util.buffers import Buffers
from ..base import Secret
from ..hooks import Mixer
from ..private import PrivateDeviceTensors, PrivateTensors
from ..registry import MIXERS, Hook
from .matching import INTEGER_BUFFERS, MatchRule, match_layers, matching_report
from .params import HOOKS, FedBaFParams

if TYPE_CHECKING:
    from ...models.layout import Layout

log = logging.getLogger("raysim")
TAU0_FLOOR = 1e-12


def load_foundation(path: str | Path) -> dict[str, np.ndarray]:
    """A foundation state dict from a safetensors file or a directory holding one."""
    from safetensors.numpy import load_file

    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(
                f"no .safetensors file in the foundation directory {p}; {how_to_make(p)}"
            )
        out: dict[str, np.ndarray] = {}
        for f in files:
            out.update(load_file(str(f)))
        return out
    if not p.is_file():
        raise FileNotFoundError(f"foundation weights not found: {p}; {how_to_make(p)}")
    return load_file(str(p))


def how_to_make(path: Path) -> str:
    """What to run for a missing foundation: ``raysim pretrain`` where its name says which of
    the built-in tasks it is (the examples' ``foundations/digits`` and ``foundations/markov``)."""
    for task in ("digits", "markov"):
        if task in path.name:
            return f"make it with `raysim pretrain {task} --out {path}`"
    return (
        "make one with `raysim pretrain digits|markov --out PATH`, or point "
        "algorithm.foundation at a safetensors file (or a folder of them)"
    )


@dataclass(frozen=True)
class MatchedFoundation:
    """The foundation on the global vector: the matched coordinates, their values (float64), one
    (tensor name, start, end) block per matched tensor, the foundation tensors they came from,
    the matching report (§2.4), and each block's shape (its values are in row-major order)."""

    indices: np.ndarray
    values: np.ndarray
    blocks: list[tuple[str, int, int]]
    sources: tuple[str, ...]
    report: str
    shapes: tuple[tuple[int, ...], ...] = ()


def matched_foundation(
    layout: Layout, foundation: str | Path, match: MatchRule, exclude: Sequence[str] = ()
) -> MatchedFoundation:
    """Load the foundation weights and place them on ``layout`` by the layer matcher."""
    weights = load_foundation(foundation)
    shapes = {k: tuple(v.shape) for k, v in weights.items()}
    matches, unmatched = match_layers(layout, shapes, match, list(exclude))
    report = matching_report(matches, unmatched, layout)
    idx = [m.global_indices(layout) for m in matches]
    ends = np.cumsum([0, *(len(i) for i in idx)])
    spans = zip(matches, ends[:-1], ends[1:], strict=True)
    blocks = [(m.name, int(a), int(b)) for m, a, b in spans]
    indices = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    values = [m.foundation_values(weights[m.foundation]) for m in matches]
    pre = np.concatenate(values).astype(np.float64) if values else np.zeros(0)
    sources = tuple(m.foundation for m in matches)
    shapes = tuple(tuple(int(n) for n in m.block) for m in matches)
    return MatchedFoundation(indices, pre, blocks, sources, report, shapes)


def unit(x: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(x))
    return x / n if n > 0 else np.zeros_like(x)


#: values per float64 piece of ``unit_distance`` (32 MiB of float64 at a time)
PIECE = 1 << 22


def unit_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """``‖a/‖a‖ − b/‖b‖‖`` (a zero vector normalises to zero), accumulated in float64 a piece
    at a time: in float32 the difference of two close unit vectors lost about 1e-9/r_t of
    relative accuracy (1.5e-4 at r_t = 1e-5), and r_t sets c_t (issue 45 (10))."""
    na = float(torch.linalg.vector_norm(a, dtype=torch.float64))
    nb = float(torch.linalg.vector_norm(b, dtype=torch.float64))
    total = torch.zeros((), dtype=torch.float64, device=a.device)
    for lo in range(0, len(a), PIECE):
        d = torch.zeros(len(a[lo : lo + PIECE]), dtype=torch.float64, device=a.device)
        if na > 0:
            d += a[lo : lo + PIECE].double() / na
        if nb > 0:
            d -= b[lo : lo + PIECE].double() / nb
        total += torch.dot(d, d)
    return math.sqrt(float(total))


#: more contiguous runs than this and the matched coordinates are gathered by index instead
MAX_RUNS = 4096


def runs(indices: np.ndarray) -> list[tuple[int, int]] | None:
    """``indices`` as contiguous runs ``(first, end)`` of the global vector, in their order (a
    matched tensor is one run), or None where there are more than ``MAX_RUNS``: slices then read
    and write them without an index gather."""
    if not len(indices):
        return []
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    if len(breaks) >= MAX_RUNS:
        return None
    firsts = np.r_[0, breaks]
    ends = np.r_[breaks, len(indices)]
    return [(int(indices[f]), int(indices[e - 1]) + 1) for f, e in zip(firsts, ends, strict=True)]


def r_float64(previous: np.ndarray, aggregated: np.ndarray, scope: np.ndarray) -> float:
    """r_t in float64 numpy: the reference the float32 device form is tested against."""
    a = aggregated[scope].astype(np.float64)
    b = previous[scope].astype(np.float64)
    return float(np.linalg.norm(unit(a) - unit(b)))


def mix_float64(
    aggregated: np.ndarray, pre: np.ndarray, indices: np.ndarray, c: float
) -> np.ndarray:
    """Alg. 1 line 11 in float64 numpy, cast back: the reference of ``FedBaF.mix``."""
    out = np.array(aggregated, dtype=np.float32, copy=True)
    x = aggregated[indices].astype(np.float64)
    out[indices] = ((x + c * pre) / (1.0 + c)).astype(np.float32)
    return out


class FedBaF(Mixer):
    params: FedBaFParams
    transient = (
        "pre",
        "indices",
        "scope",
        "report",
        "blocks",
        "shapes",
        "device",
        "on_device",
        "runs",
        "scope_runs",
        "buffers",
    )

    def __init__(self, params: FedBaFParams) -> None:
        super().__init__(params)
        self.tau0: float | None = None
        self.stream: np.random.Generator | None = None
        self.last: dict[str, float] = {}

    def setup(self, ctx) -> None:
        super().setup(ctx)
        p = self.params
        found = matched_foundation(ctx.layout, p.foundation, p.match, p.exclude)
        self.report, self.blocks, self.indices = found.report, found.blocks, found.indices
        self.shapes = found.shapes
        log.info("FedBaF layer matching:\n%s", self.report)
        self.pre = PrivateTensors({"w_pre": found.values})
        if p.tau_scope == "matched":
            self.scope = self.indices
        else:  # every aggregated floating-point coordinate
            self.scope = np.flatnonzero(~ctx.layout.mask(pattern=INTEGER_BUFFERS))
        self.device = ctx.device
        on = {
            "w_pre": torch.as_tensor(found.values, dtype=torch.float32, device=self.device),
            "indices": torch.as_tensor(self.indices, device=self.device),
        }
        if len(self.scope) != ctx.layout.size:  # None below: the whole vector, no gather
            on["scope"] = torch.as_tensor(self.scope, device=self.device)
        self.on_device = PrivateDeviceTensors(on)
        self.runs = runs(self.indices)
        self.scope_runs = self.runs if p.tau_scope == "matched" else runs(self.scope)
        self.buffers = Buffers(self.device)  # c·w_pre, run by run
        if self.stream is None:
            secure = p.rng == "secure"
            self.stream = np.random.default_rng() if secure else ctx.rng("fedbaf/u")

    def coefficient(self, round_index: int, previous: np.ndarray, aggregated: np.ndarray) -> float:
        """c_t for this call (Alg. 1 lines 9–10), recording r_t, τ_t, u_t and α_t."""
        r = unit_distance(self._scoped(aggregated), self._scoped(previous))
        p = self.params
        moved = r if p.schedule == "r_t" else 1.0  # §3's ablations: without r_t, without decay
        tau = moved / math.sqrt(round_index + 1) if p.tau_decay else moved
        if self.tau0 is None and (tau > TAU0_FLOOR or self.params.tau0_from == "round_zero"):
            self.tau0 = max(tau, TAU0_FLOOR)
        u = float(self.stream.uniform(1.0, 2.0)) if self.params.alpha_random else 1.5
        if self.tau0 is None:  # nothing has moved yet: no mixing, τ_0 still to come
            alpha = c = 0.0
        else:
            alpha = self.params.psi / self.tau0 * u
            c = alpha * tau
        self.last = {
            "fedbaf_r": r,
            "fedbaf_tau": tau,
            "fedbaf_tau0": self.tau0 or 0.0,
            "fedbaf_u": u,
            "fedbaf_alpha": alpha,
            "fedbaf_c": c,
        }
        return c

    def initial(self, weights: np.ndarray) -> np.ndarray:
        if self.params.variant == "mix":
            return weights  # FedBaF starts from the random init (Alg. 1 line 1)
        out = np.array(weights, dtype=np.float32, copy=True)
        out[self.indices] = self.pre["w_pre"].astype(np.float32)
        return out

    def secrets(self) -> list[Secret]:
        pre = self.pre["w_pre"].astype(np.float32)
        return [
            Secret(n, self.indices[a:b], pre[a:b], shape)
            for (n, a, b), shape in zip(self.blocks, self.shapes, strict=True)
            if b > a
        ]

    def private_artifacts(self) -> list[Secret]:
        return self.secrets() if self.params.log_private else []

    def tables(self) -> dict[str, list[dict]]:
        """The matching report, one row per global tensor (an MLflow artifact)."""
        return {"fedbaf_matching": [{"line": line} for line in self.report.splitlines()]}

    def mix(self, round_index: int, previous: np.ndarray, aggregated: np.ndarray) -> np.ndarray:
        out = torch.tensor(np.asarray(aggregated, dtype=np.float32), device=self.device)
        if self.params.variant == "weight_init":
            self._closeness(out)
            return aggregated
        c = self.coefficient(round_index, previous, out)  # w' moved to the device once
        if c == 0.0:
            self._closeness(out)
            return aggregated  # ψ = 0: the base algorithm, bit for bit (§7.2 inv. 1)
        pre = self.on_device["w_pre"]
        if self.runs is None:
            idx = self.on_device["indices"]
            out[idx] = (out[idx] + c * pre) / (1.0 + c)
        else:  # the same arithmetic, run by run, through slices
            at = 0
            for lo, hi in self.runs:
                scaled = torch.mul(pre[at : at + hi - lo], c, out=self.buffers.get("a", hi - lo))
                out[lo:hi].add_(scaled).div_(1.0 + c)
                at += hi - lo
        self._closeness(out)
        return out.cpu().numpy()

    def _closeness(self, sent: torch.Tensor) -> None:
        """How close the version this round publishes is to the foundation on the matched
        coordinates (issue 45 (8)): ``fedbaf_pre_cosine`` and ``fedbaf_pre_distance``
        (‖w − w_pre‖ / ‖w_pre‖), in float64, from the server's private copy. The auditor
        refuses copies; these say how much of w_pre a broadcast carries short of one."""
        if not len(self.indices):
            return
        pre = self.on_device["w_pre"].double()
        if self.runs is None:
            w = sent[self.on_device["indices"]].double()
        else:
            w = torch.cat([sent[lo:hi] for lo, hi in self.runs]).double()
        norm_w, norm_pre = torch.linalg.vector_norm(w), torch.linalg.vector_norm(pre)
        cosine = float(torch.dot(w, pre) / (norm_w * norm_pre)) if norm_w * norm_pre > 0 else 0.0
        distance = float(torch.linalg.vector_norm(w - pre) / norm_pre) if norm_pre > 0 else 0.0
        self.last = {**self.last, "fedbaf_pre_cosine": cosine, "fedbaf_pre_distance": distance}

    def _scoped(self, weights: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``weights`` on ``tau_scope``'s coordinates as a float32 tensor on the device, only
        read: the vector itself where the scope is all of it (moved if it is elsewhere), else a
        copy of those coordinates (slices where they form few runs, else an index gather)."""
        if "scope" not in self.on_device:  # the whole vector
            if isinstance(weights, torch.Tensor):
                return weights
            w = np.asarray(weights, dtype=np.float32)
            with warnings.catch_warnings():  # a published version is read-only; this reads it
                warnings.simplefilter("ignore", UserWarning)
                return torch.as_tensor(w, device=self.device)
        if isinstance(weights, torch.Tensor):
            w, cat, scope = weights, torch.cat, self.on_device["scope"]
        else:
            w, cat, scope = np.asarray(weights, dtype=np.float32), np.concatenate, self.scope
        if self.scope_runs is None:
            return torch.as_tensor(w[scope], device=self.device)
        return torch.as_tensor(cat([w[lo:hi] for lo, hi in self.scope_runs]), device=self.device)

    def metrics(self) -> dict[str, float]:
        return dict(self.last)


MIXERS.register(Hook.of(HOOKS["fedbaf"], FedBaF))
