"""Small pieces shared by the test suites: assertions on Results, a manual clock, and a bounded
wait for a condition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ErrorKind, ProviderError

T = TypeVar("T")


def ok(result: Result[T, object]) -> T:
    """The success value, or a test failure showing the error."""
    assert isinstance(result, Success), result
    value: T = result.unwrap()
    return value


def error_kind(result: Result[object, ProviderError]) -> ErrorKind:
    return error_of(result).kind


def error_of(result: Result[object, ProviderError]) -> ProviderError:
    assert isinstance(result, Failure), result
    error: ProviderError = result.failure()
    return error


def present(part: T | None) -> T:
    """A backend's optional part (snapshots, cloning, ...) that the backend under test has: a
    test failure, not an AttributeError on None, when it lacks it."""
    assert part is not None, "the backend under test lacks this part"
    return part


class ManualClock:
    """Time that moves only when told to, so deadline logic is tested without sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.now()

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class TickingClock(ManualClock):
    """A manual clock on which every reading of elapsed time takes `tick` seconds: what a
    transfer times lasts, deterministically, without sleeping."""

    def __init__(self, tick: float = 0.001) -> None:
        super().__init__()
        self._tick = tick

    def monotonic(self) -> float:
        self.advance(self._tick)
        return self.now()


class CountingWatch:
    """A transfer's watch as a use case hands it in: it counts the bytes it is told of, and
    says stop (UNAVAILABLE) from its `stop_at`th question on (None: never)."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.bytes = 0
        self.questions = 0
        self._stop_at = stop_at

    def add(self, count: int) -> Result[None, ProviderError]:
        self.bytes += count
        return self.check()

    def check(self) -> Result[None, ProviderError]:
        self.questions += 1
        if self._stop_at is not None and self.questions >= self._stop_at:
            return Failure(ProviderError.unavailable("the transfer's caller is gone"))
        return Success(None)


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Return once `condition()` holds (polled); a test failure naming `what` when it has not
    within `seconds`. The bound is a liveness bound, never a speed claim: make it generous."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)
