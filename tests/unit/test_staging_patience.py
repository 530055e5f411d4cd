"""The rules of waiting out a staging store, on a clock that moves only when waited on: the
budget, what is retried, the stop; and the deferred aborts' backoff and bound."""

from __future__ import annotations

import threading
import time

import pytest
from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.deferred_aborts import MAX_PENDING, DeferredAborts
from pyrigaud.adapters.staging.patience import LONGEST_PAUSE_SECONDS, Patience
from pyrigaud.domain.errors import ProviderError

from support import ManualClock

DOWN = ProviderError.unavailable("the store did not answer")


class Store:
    """Unavailable for `failures` tries (-1: always), then answers; notes when it was tried."""

    def __init__(self, clock: ManualClock, failures: int, error: ProviderError = DOWN) -> None:
        self.clock = clock
        self.failures = failures
        self.error = error
        self.tried_at: list[float] = []

    def call(self) -> Result[str, ProviderError]:
        self.tried_at.append(self.clock.now())
        if self.failures != 0:
            self.failures -= 1 if self.failures > 0 else 0
            return Failure(self.error)
        return Success("answer")


def test_a_blip_shorter_than_the_budget_is_waited_out_with_growing_pauses() -> None:
    clock = ManualClock()
    store = Store(clock, failures=6)
    assert Patience(clock, 30).retried("call", store.call) == Success("answer")
    pauses = [b - a for a, b in zip(store.tried_at, store.tried_at[1:], strict=False)]
    assert pauses == sorted(pauses)
    assert max(pauses) == LONGEST_PAUSE_SECONDS


def test_past_the_budget_the_last_error_is_answered_and_no_try_starts_after_it() -> None:
    clock = ManualClock()
    store = Store(clock, failures=-1)
    assert Patience(clock, 5).retried("call", store.call) == Failure(DOWN)
    assert store.tried_at[-1] - store.tried_at[0] == pytest.approx(5)


@pytest.mark.parametrize(
    "error",
    [
        ProviderError.permission_denied("refused"),
        ProviderError.not_found("no such object"),
        ProviderError.resource_exhausted("full"),
    ],
)
def test_a_refusal_is_not_tried_again(error: ProviderError) -> None:
    clock = ManualClock()
    store = Store(clock, failures=-1, error=error)
    dropped: list[bool] = []
    tried = Patience(clock, 30).retried(
        "call", store.call, after_failure=lambda: dropped.append(True)
    )
    assert tried == Failure(error)
    assert len(store.tried_at) == 1
    assert dropped == [True]  # the broken connection is dropped all the same


def test_no_budget_means_one_try_and_a_stop_ends_the_retries() -> None:
    clock = ManualClock()
    once = Store(clock, failures=-1)
    assert Patience(clock, 0).retried("call", once.call) == Failure(DOWN)
    assert len(once.tried_at) == 1
    stopped = threading.Event()
    stopped.set()
    store = Store(clock, failures=-1)
    assert Patience(clock, 30).retried("call", store.call, stop=stopped) == Failure(DOWN)
    assert len(store.tried_at) == 1


def _settled(aborts: DeferredAborts) -> None:
    deadline = time.monotonic() + 10
    while aborts.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert aborts.pending() == 0


def test_a_deferred_abort_is_tried_with_backoff_until_the_store_answers() -> None:
    clock = ManualClock()
    store = Store(clock, failures=4)
    aborts = DeferredAborts(clock)

    def abort() -> Result[None, ProviderError]:
        return store.call().map(lambda _: None)

    aborts.defer("an upload", abort)
    _settled(aborts)
    assert len(store.tried_at) == 5
    pauses = [b - a for a, b in zip(store.tried_at, store.tried_at[1:], strict=False)]
    assert pauses == sorted(pauses)


def test_deferred_aborts_are_bounded_and_given_up_to_the_sweep() -> None:
    clock = ManualClock()
    hold = threading.Event()
    never = Store(clock, failures=-1)

    def blocked() -> Result[None, ProviderError]:
        hold.wait(10)
        return never.call().map(lambda _: None)

    aborts = DeferredAborts(clock)
    for _ in range(MAX_PENDING + 5):
        aborts.defer("an upload", blocked)
    assert aborts.pending() == MAX_PENDING  # the rest are left to the sweep
    hold.set()
    _settled(aborts)  # each given up after GIVE_UP_SECONDS of clock time
