"""A client's side of differential privacy, on its worker: clip its delta, noise it (local DP).

Every delta a worker returns passes through ``ClientPrivacy.apply`` once, after the method's local
work and any client behaviour, whichever way the client trained (one after another, in a batched
group, in a multi-LoRA group): its L2 norm, over the whole vector sent, is cut to C. numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .settings import PrivacyConfig

#: the downlink tensor that carries this round's clip norm where it changes (adaptive clipping)
CLIP_KEY = "privacy/clip"
#: a client's metric: 1.0 where its delta's norm was within C (adaptive clipping's count)
WITHIN_METRIC = "dp_within_clip"
#: a local-DP job's noise stream: default_rng([job seed, LOCAL_NOISE_TAG])
LOCAL_NOISE_TAG = 0x10CA
#: the downlink tensor that carries each client's share of distributed noise (its std, real units)
SHARE_KEY = "privacy/noise_share"
#: a distributed-DP job's noise stream: default_rng([job seed, SHARE_NOISE_TAG])
SHARE_NOISE_TAG = 0xD15D


def clip(delta: np.ndarray, bound: float) -> tuple[np.ndarray, float]:
    """``delta`` scaled down to L2 norm ``bound`` where it is longer (float32), and its norm
    before (computed in float64)."""
    wide = delta.astype(np.float64)
    norm = float(np.sqrt(np.dot(wide, wide)))
    if norm <= bound:
        return delta, norm
    return (delta * np.float32(bound / norm)).astype(np.float32, copy=False), norm


class ClientPrivacy:
    """What a worker does to each delta it returns under ``privacy``."""

    def __init__(self, cfg: PrivacyConfig, seed: int = 0, num_clients: int = 1) -> None:
        self.cfg = cfg
        self.canaries = None
        if cfg.audit.canaries:
            from .canaries import Canaries

            self.canaries = Canaries(cfg, seed, num_clients)

    def bound(self, downlink: Mapping[str, np.ndarray]) -> float:
        """This round's C: the server's (adaptive clipping), else the config's."""
        sent = downlink.get(CLIP_KEY)
        return float(np.asarray(sent).reshape(-1)[0]) if sent is not None else self.cfg.clip

    def apply(
        self,
        delta: np.ndarray,
        downlink: Mapping[str, np.ndarray],
        job_seed: int,
        metrics: Mapping[str, float],
        client: int = -1,
    ) -> tuple[np.ndarray, dict[str, float]]:
        """The delta clipped to C (plus local noise of std z·C where ``mode: local``) and the
        job's metrics with ``WITHIN_METRIC`` added; a canary's (``privacy.audit``) replaced
        first."""
        bound = self.bound(downlink)
        delta = np.asarray(delta, dtype=np.float32)
        if self.canaries is not None:
            delta = self.canaries.update(client, delta, bound)
        clipped, norm = clip(delta, bound)
        out = {**metrics, WITHIN_METRIC: 1.0 if norm <= bound else 0.0}
        if self.cfg.secure_aggregation.enabled:  # the encoding's grid: rint(x·2^f)·2^-f
            from .secagg import PEAK_METRIC

            clipped = self._encoded(clipped, bound, downlink, job_seed)
            out[PEAK_METRIC] = float(np.abs(clipped).max()) if clipped.size else 0.0
        if self.cfg.mode == "local" and self.cfg.noise_multiplier > 0:
            rng = np.random.default_rng([job_seed, LOCAL_NOISE_TAG])
            noise = rng.standard_normal(clipped.shape, dtype=np.float32)
            clipped = clipped + noise * np.float32(self.cfg.noise_multiplier * bound)
        return clipped, out

    def _encoded(
        self, clipped: np.ndarray, bound: float, downlink: Mapping[str, np.ndarray], seed: int
    ) -> np.ndarray:
        """The clipped delta on the encoding's grid, plus this client's share of distributed
        noise where the server asked for it (``SHARE_KEY``: integer noise of std share·2^f
        units, Skellam or discrete Gaussian, from the job's seeded stream)."""
        from . import secagg
        from .secure_rounds import secagg_config

        s = self.cfg.secure_aggregation
        grid = secagg_config(s, bound)
        units = secagg.decode(secagg.encode(clipped, grid), grid)
        share = downlink.get(SHARE_KEY)
        if s.noise != "server" and share is not None:
            std = float(np.asarray(share).reshape(-1)[0])
            rng = np.random.default_rng([seed, SHARE_NOISE_TAG])
            noise = secagg.integer_noise(s.noise, units.shape, std, grid, rng)
            units = units + np.ldexp(noise.astype(np.float64), -s.scale_bits)
        return units.astype(np.float32)
