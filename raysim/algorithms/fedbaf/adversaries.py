"""FedBaF's adversaries (FedBaF spec §4.4, §6.3) as client behaviours (``hooks.clients``).

- ``label_shuffle``: the client permutes the labels of its local data before training, and trains
  λ× (vision) or 1/λ× (LM) its epochs (FedBaF spec §4.4, the paper's untargeted attacker; next-token
  targets for a causal LM).
- ``backdoor``: a pixel-pattern trigger stamped on part of the client's images, relabelled to a
  target class, with optional update boosting (§6.3's extension); adds the ``backdoor`` evaluation
  set, whose accuracy is the attack success rate.
- ``observe``: a curious client that records every broadcast it receives and the update it sends
  (§6.3's collusion observer; ``raysim extract`` reads the records).

``fraction: ζ`` picks the attacking set once from the run seed (``chosen_clients``). Randomness
comes from the run seed and the client id (fixed per client) or the job seed (per visit), never
from the client's own training streams, so results stay independent of the worker that ran a job.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..base import ClientContext
from ..hooks import ClientBehaviour
from ..registry import BEHAVIOURS, Hook
from .params import HOOKS, BackdoorParams, LabelShuffleParams, ObserveParams


def client_generator(seed: int, client: int, name: str) -> torch.Generator:
    """A generator fixed per (run seed, client, purpose): the same on every visit and worker."""
    state = np.random.SeedSequence([seed, client, zlib.crc32(name.encode())]).generate_state(1)
    return torch.Generator().manual_seed(int(state[0]))


def scaled_epochs(config: Any, n: int, epochs: float) -> Any:
    """Local settings for a fractional number of epochs: ⌈e⌉ epochs, stopped after ⌈e·steps⌉
    optimizer steps when e is not whole (FedBaF spec §4.4)."""
    whole = math.ceil(epochs - 1e-9)
    update: dict[str, Any] = {"epochs": whole}
    if not math.isclose(epochs, whole):
        steps_per_epoch = math.ceil(n / config.batch_size)
        update["max_steps"] = max(1, math.ceil(epochs * steps_per_epoch - 1e-9))
    return config.model_copy(update=update)


class LabelShuffle(ClientBehaviour):
    params: LabelShuffleParams
    attack = True

    def _generator(self, ctx: ClientContext) -> torch.Generator:
        if self.params.permutation == "per_visit":
            return torch.Generator().manual_seed(ctx.seed ^ 0x5A1F)
        return client_generator(self.run_seed, ctx.client_id, "label_shuffle")

    def on_data(self, ctx: ClientContext, data: Any) -> Any:
        gen = self._generator(ctx)
        if isinstance(data, dict):  # causal LM: shuffle the next-token targets among positions
            labels = data["labels"].clone()
            mask = labels != -100
            values = labels[mask]
            labels[mask] = values[torch.randperm(len(values), generator=gen)]
            return {**data, "labels": labels}
        x, y = data
        return x, y[torch.randperm(len(y), generator=gen)]

    def on_local(self, ctx: ClientContext, config: Any) -> Any:
        p = self.params
        if p.epoch_scale == 1.0:
            return config
        scale = p.epoch_scale if p.epoch_rule == "multiply" else 1.0 / p.epoch_scale
        return scaled_epochs(config, ctx.task.num_examples(ctx.data), config.epochs * scale)


def stamp(x: np.ndarray | torch.Tensor, p: BackdoorParams) -> Any:
    """A copy of images ``x`` (N, F) or (N, C, H, W) with the trigger in the bottom-right corner."""
    out = x.clone() if isinstance(x, torch.Tensor) else np.array(x, copy=True)
    if out.ndim == 2:
        h, w = p.image_shape or (math.isqrt(out.shape[1]),) * 2
        if h * w != out.shape[1]:
            raise ValueError(
                f"backdoor: flat inputs of {out.shape[1]} features are not {h}x{w} images; "
                "set image_shape"
            )
        view = out.reshape(len(out), 1, h, w)
    elif out.ndim == 4:
        view = out
    else:
        raise ValueError("backdoor needs image inputs, (N, H*W) or (N, C, H, W)")
    if p.size > min(view.shape[-2:]):
        raise ValueError(f"backdoor trigger size {p.size} exceeds the image {view.shape[-2:]}")
    view[..., -p.size :, -p.size :] = p.value
    return out


class Backdoor(ClientBehaviour):
    params: BackdoorParams
    attack = True

    def on_data(self, ctx: ClientContext, data: Any) -> Any:
        if isinstance(data, dict):
            raise ValueError("backdoor needs image classification data, not a language task")
        x, y = data
        n = len(y)
        k = max(1, round(self.params.poison_fraction * n))
        gen = client_generator(self.run_seed, ctx.client_id, "backdoor")
        rows = torch.randperm(n, generator=gen)[:k]
        x, y = x.clone(), y.clone()
        x[rows] = stamp(x[rows], self.params)
        y[rows] = self.params.target
        return x, y

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        if self.params.boost == 1.0:
            return delta
        return (delta * np.float32(self.params.boost)).astype(np.float32)

    def eval_sets(self, dataset: Any) -> dict[str, Any]:
        """``backdoor``: the test images of other classes, triggered, labelled ``target``; its
        accuracy is the attack success rate."""
        from ...data import LabelledSet

        keep = dataset.y_test != self.params.target
        x = stamp(dataset.x_test[keep], self.params)
        return {"backdoor": LabelledSet(x, np.full(int(keep.sum()), self.params.target))}


#: one record per job: r{dispatch round}_c{client}.safetensors
RECORD = "r{round:06d}_c{client:06d}"


class Observe(ClientBehaviour):
    """§6.3's collusion observer: records the broadcast it received and the delta it sends (after
    every behaviour listed before it), with its sample count. Records are files, one per job,
    written atomically; a job re-run after a worker's death writes the same bytes."""

    params: ObserveParams

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        from safetensors.numpy import save_file

        folder = Path(self.params.dir).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        stem = RECORD.format(round=ctx.dispatch_round, client=ctx.client_id)
        meta = {
            "client": ctx.client_id,
            "dispatch_round": ctx.dispatch_round,
            "num_samples": int(ctx.task.num_examples(ctx.data)),
        }
        tensors = {
            "received": np.ascontiguousarray(ctx.received, dtype=np.float32),
            "delta": np.ascontiguousarray(delta, dtype=np.float32),
        }
        tmp = folder / f".{stem}.tmp"
        save_file(tensors, str(tmp), metadata={k: str(v) for k, v in meta.items()})
        tmp.replace(folder / f"{stem}.safetensors")
        return delta


BEHAVIOURS.register(Hook.of(HOOKS["label_shuffle"], LabelShuffle))
BEHAVIOURS.register(Hook.of(HOOKS["backdoor"], Backdoor))
BEHAVIOURS.register(Hook.of(HOOKS["observe"], Observe))
