"""Time, a port so that deadlines and durations can be tested without sleeping."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch (deadlines are shared between replicas)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start on a clock that only moves forward: elapsed time
        within this process, which a step of the wall clock must not bend."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait; a test clock just moves on."""
        ...
