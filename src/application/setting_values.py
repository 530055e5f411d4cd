"""How a setting's text becomes its value, the same for the common settings and for each
hypervisor's own (`hypervisor_plugin.py`), so `true`/`on`/`1` mean one thing everywhere."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _boolean(value: object) -> object:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(f"must be true or false, got {value!r}")
    return value


Flag = Annotated[bool, BeforeValidator(_boolean)]
"""A yes/no setting: true, yes, on, 1 or false, no, off, 0, empty (any case); else refused."""


def one_of(value: str, choices: tuple[str, ...], *, default: str) -> str:
    """A case-insensitive choice; empty means the default."""
    choice = value.strip().lower() or default
    if choice not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
    return choice
