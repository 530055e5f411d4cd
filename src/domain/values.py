"""The base of every domain value, apart from `models` so that the staging values (which the
transfer requests in `models` carry) can build on it without an import cycle."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Value(BaseModel):
    """Base of every domain value: immutable, and no field the model does not declare."""

    model_config = ConfigDict(frozen=True, extra="forbid")
