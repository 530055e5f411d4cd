"""The threads that serve the gRPC server's calls: a fixed pool doing less per call than
`concurrent.futures.ThreadPoolExecutor`.

grpcio's sync server hands every RPC to its pool with `submit(fn, *args)` and calls
`add_done_callback` on what comes back (to count the RPCs in flight); that is all it asks of
a pool. A ThreadPoolExecutor does more for each call: a Future with its own Condition,
running and result states set under it, an idle-worker semaphore taken and given back. Here a
call is one tuple on a lock-free queue and a slotted record of its callbacks: about 11% of the
machine instructions a bare grpcio server spends per Describe (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

_Callback = Callable[["SubmittedCall"], object]


class SubmittedCall:
    """What `submit` returns: done once its function has returned or raised, and then its
    callbacks run, on the worker (or at once, when added after that)."""

    __slots__ = ("_callbacks", "_done")

    # One lock for every call: taken only around the done flag and the callback list, for
    # the instant the server's poll thread and a finishing worker may both reach them.
    _completion = threading.Lock()

    def __init__(self) -> None:
        self._callbacks: list[_Callback] = []
        self._done = False

    def add_done_callback(self, callback: _Callback) -> None:
        with self._completion:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback(self)

    def finish(self) -> None:
        """Called by the pool once the call's function has returned or raised."""
        with self._completion:
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                logger.exception("a gRPC call's completion callback failed")


_Job = tuple[SubmittedCall, Callable[..., object], tuple[Any, ...], dict[str, Any]]


class RpcWorkers:
    """At most `workers` threads, started one per call submitted until all are up, taking
    calls in order from one queue. `shutdown` lets the queued calls finish, then ends them."""

    def __init__(self, workers: int, name_prefix: str = "rpc") -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._unstarted = workers
        self._name_prefix = name_prefix
        self._closing = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[..., object], /, *args: Any, **kwargs: Any) -> SubmittedCall:
        call = SubmittedCall()
        # Under the lock, so that a shutdown meanwhile still finds a worker for this call.
        with self._closing:
            if self._shut:
                raise RuntimeError("cannot take a call after shutdown")
            self._jobs.put((call, fn, args, kwargs))
            if self._unstarted:
                self._start_worker()
        return call

    def shutdown(self, wait: bool = True) -> None:
        """No new calls; the queued ones still run; then every worker ends."""
        with self._closing:
            if self._shut:
                return
            self._shut = True
            for _ in self._threads:
                self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _start_worker(self) -> None:
        """One more worker (the caller holds `_closing`)."""
        self._unstarted -= 1
        thread = threading.Thread(
            target=self._work, name=f"{self._name_prefix}_{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        take = self._jobs.get
        while (job := take()) is not None:
            call, fn, args, kwargs = job
            try:
                fn(*args, **kwargs)
            except BaseException:
                # grpcio's handlers answer their own errors; one that escapes is a bug there.
                logger.exception("a gRPC call raised out of its handler")
            call.finish()
