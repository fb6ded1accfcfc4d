"""Strict pydantic base for every config section: unknown keys fail naming the closest valid one."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def unknown_key_message(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; valid keys: {', '.join(sorted(valid))}"


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
