"""Noise robustness of the foundation (FedBaF spec §6.3, the paper's Fig. 8).

``w_pre + noise`` on its matched tensors, with an error rate ``e = ‖noise‖ / ‖w_pre‖`` per tensor:
``rms`` mode draws N(0, σ²) with σ = e·RMS(tensor) (the paper's "scaled by the magnitude of each
foundation model's weights"); ``magnitude`` mode scales each element's noise by |w_pre,j| (the
spec's alternative), normalised to the same e. The noisy foundation keeps its own head and is
scored on its own source task, which a ``raysim pretrain`` foundation records in its metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.algorithms.fedbaf.mixer import MatchedFoundation, load_foundation

NOISE_TAG = 0xF18  # rng = default_rng([seed, NOISE_TAG, i]) for the i-th (mode, e) point
MODES = ("rms", "magnitude")


def noisy(tensor: np.ndarray, error_rate: float, mode: str, rng: np.random.Generator) -> np.ndarray:
    """``tensor`` plus noise whose norm is ``error_rate`` times the tensor's norm."""
    w = np.asarray(tensor, dtype=np.float64)
    z = rng.standard_normal(w.shape)
    if mode == "magnitude":
        z = z * np.abs(w)
    elif mode != "rms":
        raise ValueError(f"noise mode must be one of {MODES}, got {mode!r}")
    nz = np.linalg.norm(z)
    scale = error_rate * np.linalg.norm(w) / nz if nz > 0 else 0.0
    return (w + scale * z).astype(tensor.dtype)


def source_task(foundation: str | Path) -> tuple[Any, np.ndarray, np.ndarray]:
    """The foundation's own model (with its head) and its source task's evaluation set."""
    from raysim.models.pretraining import read_metadata
    from raysim.models.registry import ModelConfig, build_handle

    meta = read_metadata(foundation)
    task = (meta or {}).get("task")
    if task == "markov":
        from raysim.data.markov import MarkovConfig
        from raysim.models.pretrain_markov import source_eval_set, source_spec

        markov = MarkovConfig(**meta["markov"])
        spec, (x, y) = source_spec(markov), source_eval_set(markov)
    elif task == "digits20":
        from raysim.models.pretrain_digits import source_eval_set, source_spec

        spec, (x, y) = source_spec(meta), source_eval_set(meta)
    else:
        raise ValueError(
            f"the foundation {foundation} does not record its source task (no "
            "raysim_foundation.json from `raysim pretrain`): the noise sweep cannot score it"
        )
    return build_handle(ModelConfig(**meta["model"]), spec), x, y


def noise_sweep(
    foundation: str | Path,
    truth: MatchedFoundation,
    errors: Sequence[float],
    seed: int,
    modes: Sequence[str] = MODES,
) -> list[dict[str, Any]]:
    """Source-task accuracy and loss of the foundation with noise on its matched tensors."""
    from raysim.training.loop import evaluate

    handle, x, y = source_task(foundation)
    weights = load_foundation(foundation)
    layout = handle.layout()
    missing = [n for n, _ in layout.shapes() if n not in weights]
    if missing:
        raise ValueError(f"the foundation lacks its own model's tensors {missing[:3]}")
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    rows = []
    for i, (mode, e) in enumerate((m, e) for m in modes for e in errors):
        rng = np.random.default_rng([seed, NOISE_TAG, i])
        state = {n: noisy(w, e, mode, rng) if n in truth.sources else w for n, w in weights.items()}
        handle.set_global(layout.flatten(state))
        scores = evaluate(handle.module, xt, yt)
        rows.append({"mode": mode, "error_rate": float(e), **scores})
    return rows
