"""Bounds on mutations, so reads never queue behind slow hypervisor work and a burst of
requests never floods the backend.

A mutation needs a token from the backend's rate limit (when one is set) and then one of a
fixed number of slots. The gRPC pool has more threads than slots; Describe, Validate and
TaskStatus take neither. A mutation waits for both within its deadline and is refused with
RESOURCE_EXHAUSTED when they cannot be had in time (never UNAVAILABLE, which trips the
manager's circuit breaker).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyrigaud.application.ports.clock import Clock

# Leave the caller this much of its deadline to do the work once a slot is free.
_DEADLINE_MARGIN_SECONDS = 1.0


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up.

    A waiter reserves the next token under the lock (the balance may go negative) and sleeps
    exactly until it is due, so waiters are served in arrival order without polling, and a
    waiter whose token could not be due within its timeout is refused at once, spending
    nothing.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Clock,
    ) -> None:
        """`clock` tells the time the tokens refill by, and waits for the next one."""
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, not {rate}/{burst}")
        self.rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock.monotonic()
        self._lock = threading.Lock()

    def acquire(self, timeout: float) -> bool:
        """Takes a token, waiting up to `timeout` seconds; False when none is due in time."""
        with self._lock:
            now = self._clock.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now
            wait = max(0.0, (1.0 - self._tokens) / self.rate)
            if wait > timeout:
                return False
            self._tokens -= 1.0
        if wait > 0:
            self._clock.sleep(wait)
        return True


def rate_limit_of(qps: float, burst: int, clock: Clock) -> TokenBucket | None:
    """The backend's bucket from PYRIGAUD_RATE_QPS/BURST; a qps of 0 means no rate limit."""
    return TokenBucket(qps, burst, clock=clock) if qps > 0 else None


@dataclass(frozen=True)
class Admission:
    """Whether a mutation may go ahead; when not, `refusal` says which limit stopped it."""

    refusal: str = ""

    def __bool__(self) -> bool:
        return not self.refusal


class MutationLimiter:
    def __init__(
        self,
        max_concurrent: int,
        max_wait_seconds: float = 30.0,
        rate_limit: TokenBucket | None = None,
        *,
        clock: Clock,
    ) -> None:
        """`clock` tells how much of a caller's deadline its wait for a token spent."""
        self._max_concurrent = max_concurrent
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._max_wait = max_wait_seconds
        self._rate_limit = rate_limit
        self._clock = clock
        self._held = 0
        self._held_lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Mutations holding a slot now (for the pyrigaud_inflight_mutations gauge)."""
        return self._held

    @contextmanager
    def slot(self, time_remaining: float | None) -> Iterator[Admission]:
        """Yields whether a token and a slot were both obtained before the caller's deadline.

        The token comes first: its refusal is computed, not waited out, and a caller refused
        for it holds no slot meanwhile. A token taken by a caller then refused a slot is not
        given back, which can only keep the backend below its rate.
        """
        budget = (
            self._max_wait if time_remaining is None else time_remaining - _DEADLINE_MARGIN_SECONDS
        )
        deadline = self._clock.monotonic() + max(0.0, budget)
        if self._rate_limit is not None and not self._rate_limit.acquire(max(0.0, budget)):
            yield Admission(
                f"too many operations: rate limit of {self._rate_limit.rate:g} mutations/s "
                "reached on this provider; retry later"
            )
            return
        acquired = self._slots.acquire(timeout=max(0.0, deadline - self._clock.monotonic()))
        if not acquired:
            yield Admission(
                f"too many operations: {self._max_concurrent} operations already in progress "
                "on this provider; retry later"
            )
            return
        with self._held_lock:
            self._held += 1
        try:
            yield Admission()
        finally:
            with self._held_lock:
                self._held -= 1
            self._slots.release()
