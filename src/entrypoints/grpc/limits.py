"""A bound on concurrent mutations, so reads never queue behind slow hypervisor work.

The gRPC pool has more threads than this bound; Describe, Validate and TaskStatus take no
slot. A mutation waits for a slot within its deadline and is refused with RESOURCE_EXHAUSTED
when none frees up in time (never UNAVAILABLE, which trips the manager's circuit breaker).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Leave the caller this much of its deadline to do the work once a slot is free.
_DEADLINE_MARGIN_SECONDS = 1.0


class MutationLimiter:
    def __init__(self, max_concurrent: int, max_wait_seconds: float = 30.0) -> None:
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._max_wait = max_wait_seconds
        self._held = 0
        self._held_lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Mutations holding a slot now (for the pyrigaud_inflight_mutations gauge)."""
        return self._held

    @contextmanager
    def slot(self, time_remaining: float | None) -> Iterator[bool]:
        """Yields whether a slot was obtained before the caller's deadline."""
        wait = (
            self._max_wait if time_remaining is None else time_remaining - _DEADLINE_MARGIN_SECONDS
        )
        acquired = self._slots.acquire(timeout=max(0.0, wait))
        if acquired:
            with self._held_lock:
                self._held += 1
        try:
            yield acquired
        finally:
            if acquired:
                with self._held_lock:
                    self._held -= 1
                self._slots.release()
