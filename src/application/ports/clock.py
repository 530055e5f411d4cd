"""Wall-clock time, a port so that deadlines can be tested without sleeping."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch (deadlines are shared between replicas)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait; a test clock just moves on."""
        ...
