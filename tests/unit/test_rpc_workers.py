"""The gRPC server's worker pool: what grpcio asks of a pool, and a clean end."""

from __future__ import annotations

import functools
import logging
import threading

import pytest

from pyrigaud.entrypoints.grpc.workers import RpcWorkers, SubmittedCall

WAIT = 10.0


def test_calls_run_on_at_most_the_given_threads_started_as_needed() -> None:
    workers = RpcWorkers(3, name_prefix="lazy")
    assert not threads_named("lazy_")  # none until a call
    release, holding = threading.Event(), threading.Semaphore(0)
    seen: set[str] = set()
    lock = threading.Lock()

    def held() -> None:
        with lock:
            seen.add(threading.current_thread().name)
        holding.release()
        release.wait(WAIT)

    calls = [workers.submit(held) for _ in range(8)]
    assert all(holding.acquire(timeout=WAIT) for _ in range(3))  # one call held per thread
    release.set()
    workers.shutdown()
    assert seen == {"lazy_0", "lazy_1", "lazy_2"}
    assert all(call_finished(call) for call in calls)


def threads_named(prefix: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(prefix)]


def call_finished(call: SubmittedCall) -> bool:
    finished = threading.Event()
    call.add_done_callback(lambda _: finished.set())
    return finished.wait(WAIT)


def test_a_callback_runs_once_whether_added_before_or_after_the_call_ends() -> None:
    workers = RpcWorkers(1)
    gate = threading.Event()
    early: list[SubmittedCall] = []
    call = workers.submit(gate.wait, WAIT)
    call.add_done_callback(early.append)
    assert early == []  # still running
    gate.set()
    workers.shutdown()
    assert early == [call]
    late: list[SubmittedCall] = []
    call.add_done_callback(late.append)
    assert late == [call]
    assert early == [call]


def test_a_raising_call_is_logged_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    workers = RpcWorkers(1)
    answers: list[int] = []

    def broken() -> None:
        raise ValueError("a handler bug")

    with caplog.at_level(logging.ERROR, logger="pyrigaud.entrypoints.grpc.workers"):
        failed = workers.submit(broken)
        workers.submit(answers.append, 42)
        workers.shutdown()
    assert answers == [42]
    assert call_finished(failed)
    assert "a handler bug" in caplog.text


def test_shutdown_lets_queued_calls_finish_then_refuses_new_ones() -> None:
    workers = RpcWorkers(2, name_prefix="ending")
    gate = threading.Event()
    done: list[int] = []

    def finish(index: int) -> None:
        gate.wait(WAIT)
        done.append(index)

    for index in range(6):
        workers.submit(functools.partial(finish, index))
    stopper = threading.Thread(target=workers.shutdown)
    stopper.start()
    gate.set()
    stopper.join(WAIT)
    assert not stopper.is_alive()
    assert sorted(done) == list(range(6))
    assert not threads_named("ending_")
    with pytest.raises(RuntimeError, match="after shutdown"):
        workers.submit(done.append, 7)


def test_at_least_one_worker() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RpcWorkers(0)
