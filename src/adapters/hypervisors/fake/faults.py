"""Fault injection for the fake hypervisor: make chosen operations fail, take time, or run
a hook on entry (one that raises plays a bug in the backend)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from returns.result import Failure, Result, Success

from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ProviderError

_NO_FAULT: Result[None, ProviderError] = Success(None)


@dataclass
class _Failure:
    error: ProviderError
    remaining: int | None  # None: every call


class FakeFaults:
    """Per-operation failures and latency.

    Operations are named by their port method (`describe`, `power_on`, `check`, ...), except
    that `start_create` and `start_clone` are `create` and `clone`, the names
    PYRIGAUD_FAKE_LATENCY documents. Latency is waited out on `clock`.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, _Failure] = {}
        self._latency: dict[str, float] = {}
        self._hooks: dict[str, Callable[[], None]] = {}

    def fail(self, operation: str, error: ProviderError, times: int | None = None) -> None:
        """Make `operation` answer `error` (the next `times` calls, or every call)."""
        with self._lock:
            self._failures[operation] = _Failure(error, times)

    def slow(self, operation: str, seconds: float) -> None:
        with self._lock:
            self._latency[operation] = seconds

    def on_entry(self, operation: str, hook: Callable[[], None]) -> None:
        """Run `hook` on entry to every call of `operation`; what it raises propagates."""
        with self._lock:
            self._hooks[operation] = hook

    def clear(self) -> None:
        with self._lock:
            self._failures.clear()
            self._latency.clear()
            self._hooks.clear()

    def before(self, operation: str) -> Result[None, ProviderError]:
        """Called on entry to each operation, outside the fake's state lock."""
        if not (self._failures or self._latency or self._hooks):
            return _NO_FAULT  # the common case, kept off the Describe hot path
        with self._lock:
            hook = self._hooks.get(operation)
            delay = self._latency.get(operation, 0.0)
            failure = self._failures.get(operation)
            if failure is not None and failure.remaining is not None:
                failure.remaining -= 1
                if failure.remaining <= 0:
                    del self._failures[operation]
        if hook is not None:
            hook()
        if delay:
            self._clock.sleep(delay)
        return Failure(failure.error) if failure is not None else Success(None)
