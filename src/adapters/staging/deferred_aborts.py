"""Aborts the store did not answer, tried again in the background until it does.

A transfer that failed because its store stopped answering cannot abort what it left there
(an S3 multipart upload holds its parts, billed, until aborted) while the store is down, and
the RPC must answer UNAVAILABLE without waiting for it. The abort is handed over here: one
thread tries each pending abort again with backoff (FIRST_PAUSE_SECONDS doubling to
LONGEST_PAUSE_SECONDS) as soon as the store answers, logging each outcome. At most
MAX_PENDING wait; one more, or one still unanswered after GIVE_UP_SECONDS, is left to the
leftover sweep (its marker stays), and logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from returns.result import Failure, Result, Success

from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ErrorKind, ProviderError

MAX_PENDING = 64
FIRST_PAUSE_SECONDS = 1.0
LONGEST_PAUSE_SECONDS = 15.0
GIVE_UP_SECONDS = 3600.0  # by then the leftover sweep treats it as abandoned

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    what: str
    abort: Callable[[], Result[None, ProviderError]]
    given_at: float
    due_at: float
    pause: float = FIRST_PAUSE_SECONDS


class DeferredAborts:
    """Pending aborts and the one thread that works them off (started at the first)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def abort_or_defer(
        self, what: str, abort: Callable[[], Result[None, ProviderError]], *, store_gone: bool
    ) -> Result[None, ProviderError]:
        """`abort` now; deferred when the store is known to be gone (the RPC answers without
        waiting for it) or does not answer now. Any other failure is the caller's."""
        if store_gone:
            self.defer(what, abort)
            return Success(None)
        match abort():
            case Failure(error) if error.kind is ErrorKind.UNAVAILABLE:
                self.defer(what, abort)
                return Success(None)
            case answer:
                return answer

    def defer(self, what: str, abort: Callable[[], Result[None, ProviderError]]) -> None:
        """Try `abort` (of `what`, for the logs) in the background until the store answers."""
        now = self._clock.now()
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                logger.warning(
                    "%d aborts already wait for their store: the abort of %s is left to the "
                    "leftover sweep",
                    MAX_PENDING,
                    what,
                )
                return
            self._pending.append(_Pending(what, abort, given_at=now, due_at=now))
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="staging-aborts", daemon=True
                )
                self._worker.start()
        logger.info("the store did not answer: %s will be aborted once it does", what)

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._worker = None
                    return
                due = min(self._pending, key=attrgetter("due_at"))
            wait = due.due_at - self._clock.now()
            if wait > 0:
                self._clock.sleep(min(wait, FIRST_PAUSE_SECONDS))
                continue
            if self._tried(due):
                with self._lock:
                    self._pending.remove(due)

    def _tried(self, pending: _Pending) -> bool:
        """One try of a due abort; whether it is settled (done, or left to the sweep)."""
        try:
            tried = pending.abort()
        except Exception:  # a bug must not end the thread other aborts wait on
            logger.exception("aborting %s failed", pending.what)
            return True
        match tried:
            case Success(_):
                logger.info("aborted %s, deferred while its store did not answer", pending.what)
                return True
            case Failure(error):
                now = self._clock.now()
                if error.kind is ErrorKind.UNAVAILABLE and now - pending.given_at < GIVE_UP_SECONDS:
                    pending.due_at = now + pending.pause
                    pending.pause = min(2 * pending.pause, LONGEST_PAUSE_SECONDS)
                    return False
                logger.warning(
                    "could not abort %s (left to the leftover sweep): %s",
                    pending.what,
                    error.message,
                )
        return True
