"""Where hypervisor credentials come from (a mounted Secret, the Kubernetes API, env)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Credentials(Protocol):
    def current(self) -> Mapping[str, str]:
        """The newest complete set of key -> value (values whitespace-trimmed)."""
        ...

    def refresh(self) -> Mapping[str, str]:
        """Re-read now (after an authentication failure) and return the result."""
        ...
