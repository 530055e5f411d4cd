"""The mutation limits on simulated time: a token bucket and the slot bound around it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.entrypoints.grpc.limits import MutationLimiter, TokenBucket, rate_limit_of

ANSWER_BOUND_SECONDS = 60  # a liveness bound: a real wait here would last an hour


class ManualMonotonic:
    """A clock that moves only when told to; its `sleep` moves it and records."""

    def __init__(self) -> None:
        self.now_seconds = 100.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.now_seconds

    def monotonic(self) -> float:
        return self.now_seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_seconds += seconds


class FrozenRecordingSleeps(ManualMonotonic):
    """Frozen: every caller is at the same instant; each thread's last wait is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.by_thread: dict[int, float] = {}
        self._lock = threading.Lock()

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.by_thread[threading.get_ident()] = seconds

    def taken(self) -> float:
        with self._lock:
            return self.by_thread.pop(threading.get_ident(), 0.0)


def bucket_on(clock: ManualMonotonic, rate: float, burst: int) -> TokenBucket:
    return TokenBucket(rate, burst, clock=clock)


def test_a_full_bucket_serves_its_burst_at_once_then_refills_at_the_rate() -> None:
    clock = ManualMonotonic()
    bucket = bucket_on(clock, rate=2, burst=3)
    assert [bucket.acquire(0) for _ in range(3)] == [True, True, True]
    assert not bucket.acquire(0)
    assert clock.slept == []
    assert bucket.acquire(0.5)
    assert clock.slept == [pytest.approx(0.5)]
    clock.now_seconds += 0.25
    assert bucket.acquire(1.0)
    assert clock.slept[-1] == pytest.approx(0.25)  # the exact rest of the interval, no polling


def test_an_idle_bucket_saves_up_no_more_than_its_burst() -> None:
    clock = ManualMonotonic()
    bucket = bucket_on(clock, rate=10, burst=4)
    clock.now_seconds += 3600
    assert sum(bucket.acquire(0) for _ in range(10)) == 4


def test_a_token_that_cannot_be_due_in_time_is_refused_at_once_and_spends_nothing() -> None:
    clock = ManualMonotonic()
    bucket = bucket_on(clock, rate=2, burst=1)
    assert bucket.acquire(0)
    assert not bucket.acquire(0.4)  # the next token is 0.5 s away
    assert not bucket.acquire(0.49)
    assert clock.slept == []  # refused by computation, not by waiting it out
    clock.now_seconds += 0.5
    assert bucket.acquire(0)  # the refused callers took nothing from the bucket
    assert clock.slept == []


def test_a_bucket_needs_a_positive_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        TokenBucket(0, 5, clock=ManualMonotonic())
    with pytest.raises(ValueError, match="burst >= 1"):
        TokenBucket(1, 0, clock=ManualMonotonic())


def test_a_qps_of_zero_means_no_rate_limit() -> None:
    assert rate_limit_of(0, 20, SystemClock()) is None
    bucket = rate_limit_of(2.5, 20, SystemClock())
    assert bucket is not None
    assert bucket.rate == 2.5


def test_many_threads_at_once_get_distinct_tokens_never_beyond_the_rate() -> None:
    """40 callers at the same instant, each willing to wait 5 s, rate 2/s, burst 3."""
    clock = FrozenRecordingSleeps()
    bucket = TokenBucket(2, 3, clock=clock)
    start = threading.Barrier(40)

    def caller() -> float | None:
        start.wait(timeout=10)
        if not bucket.acquire(5.0):
            return None
        return clock.taken()

    with ThreadPoolExecutor(40) as pool:
        outcomes = list(pool.map(lambda _: caller(), range(40)))
    granted = sorted(wait for wait in outcomes if wait is not None)
    # The burst at once, then one every 0.5 s up to the 5 s the callers would wait.
    assert granted == pytest.approx([0.0, 0.0, 0.0] + [0.5 * step for step in range(1, 11)])
    for first in range(len(granted)):
        for last in range(first, len(granted)):
            assert last - first + 1 <= 3 + 2 * (granted[last] - granted[first]) + 1e-9


def test_without_a_rate_limit_only_the_slots_bound_mutations() -> None:
    limiter = MutationLimiter(max_concurrent=2, clock=SystemClock())
    with limiter.slot(None) as first, limiter.slot(None) as second:
        assert first
        assert second
        assert limiter.in_flight == 2
        with limiter.slot(0.5) as third:  # under the deadline margin: no waiting
            assert not third
            assert third.refusal.startswith("too many operations: 2 operations already in progress")
        assert limiter.in_flight == 2
    assert limiter.in_flight == 0


def test_a_mutation_beyond_the_rate_is_refused_naming_the_rate_and_holding_no_slot() -> None:
    clock = ManualMonotonic()
    limiter = MutationLimiter(
        max_concurrent=4, rate_limit=bucket_on(clock, rate=2, burst=1), clock=clock
    )
    with limiter.slot(5.0) as granted:
        assert granted
        assert limiter.in_flight == 1
        with limiter.slot(1.4) as refused:  # 0.4 s to spare after the margin; 0.5 s needed
            assert not refused
            assert "rate limit of 2 mutations/s reached" in refused.refusal
            assert limiter.in_flight == 1
    assert clock.slept == []
    with limiter.slot(1.5) as waited:  # exactly enough: waits the 0.5 s, then takes a slot
        assert waited
        assert clock.slept == [pytest.approx(0.5)]


def test_the_wait_for_a_token_is_taken_out_of_the_wait_for_a_slot() -> None:
    """The token's wait (on the manual clock) spends the whole budget: the slot is not waited
    for again in real time, which would take an hour, far past the bound of the answer."""
    clock = ManualMonotonic()
    limiter = MutationLimiter(
        max_concurrent=1, rate_limit=bucket_on(clock, rate=1 / 3600, burst=1), clock=clock
    )
    refusals: list[str] = []

    def late_caller() -> None:
        with limiter.slot(3601.0) as late:  # the token takes all 3600 s left after the margin
            refusals.append(late.refusal)

    with limiter.slot(None) as holder:
        assert holder
        caller = threading.Thread(target=late_caller, daemon=True)
        caller.start()
        caller.join(ANSWER_BOUND_SECONDS)
        assert not caller.is_alive(), "the slot was waited for in real time after the token"
    assert len(refusals) == 1
    assert "1 operations already in progress" in refusals[0]
    assert clock.slept == [pytest.approx(3600.0)]
