"""Strict pydantic base for every config section: unknown keys fail naming the closest valid one."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

#: names other tools use, for raysim's own (spelling alone does not lead from one to the other)
SYNONYMS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr", "server_lr"),
    "step_size": ("lr",),
    "num_rounds": ("rounds",),
    "n_rounds": ("rounds",),
    "num_epochs": ("epochs",),
    "local_epochs": ("epochs",),
    "bs": ("batch_size",),
    "batchsize": ("batch_size",),
    "optimiser": ("optimizer",),
    "num_clients": ("num",),
    "n_clients": ("num",),
    "clients_per_round": ("per_round",),
    "random_seed": ("seed",),
    "wd": ("weight_decay",),
}


def closest(key: str, valid: list[str]) -> str | None:
    """The valid name ``key`` most likely meant: a known synonym, else the closest spelling."""
    for name in SYNONYMS.get(key.lower(), ()):
        if name in valid:
            return name
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return close[0] if close else None


def did_you_mean(key: str, valid: list[str]) -> str:
    """`` (did you mean 'x'?)``, or nothing where no valid name is near."""
    close = closest(key, valid)
    return f" (did you mean {close!r}?)" if close else ""


def unknown_key_message(key: str, valid: list[str]) -> str:
    return f"unknown key {key!r}{did_you_mean(key, valid)}; valid keys: {', '.join(sorted(valid))}"


class StrictModel(BaseModel):
    """A config section that rejects unknown keys with a 'did you mean' hint."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            valid = list(cls.model_fields)
            for alias in (f.alias for f in cls.model_fields.values() if f.alias):
                valid.append(alias)
            for key in data:
                if key not in valid:
                    raise ValueError(unknown_key_message(str(key), valid))
        return data
