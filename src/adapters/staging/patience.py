"""How long a staging adapter waits out a store that stopped answering before it gives up.

A storage blip (a restarted S3 gateway, an NFS server failing over) must not fail a transfer
of tens of GiB that a retry would start from scratch. So each step of a transfer that the
store can fail transiently (an S3 part, an S3 ranged read, an NFS read or write at an offset)
is tried again with backoff while its budget lasts: `STAGING_RETRY_SECONDS` from the step's
first failure, a new budget for each step. Only UNAVAILABLE is retried (no answer, a cut
connection, a 5xx, a timeout); a refusal (credentials, a missing object, a full disk) is not.

The last try starts before the budget ends, so a step gives up at most one request timeout
after it; the pause before a try never runs past the budget.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ErrorKind, ProviderError

STAGING_RETRY_SECONDS = 30.0  # PYRIGAUD_STAGING_RETRY_SECONDS
FIRST_PAUSE_SECONDS = 0.25
LONGEST_PAUSE_SECONDS = 2.0
T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Patience:
    """Retries of one step while the store is unavailable, for up to `seconds` (0: none)."""

    clock: Clock
    seconds: float = STAGING_RETRY_SECONDS

    def retried(
        self,
        doing: str,
        step: Callable[[], Result[T, ProviderError]],
        *,
        stop: threading.Event | None = None,
        after_failure: Callable[[], None] = lambda: None,
    ) -> Result[T, ProviderError]:
        """`step`, tried again while it fails UNAVAILABLE and the budget lasts; `after_failure`
        runs after each failed try (to drop a broken connection); a set `stop` ends the
        retries at once (a sibling step gave up, the transfer is being aborted)."""
        deadline: float | None = None
        pause = FIRST_PAUSE_SECONDS
        tries = 0
        while True:
            tries += 1
            match step():
                case Success(answer):
                    if tries > 1:
                        logger.info("%s: went through at try %d", doing, tries)
                    return Success(answer)
                case Failure(error) as failed:
                    after_failure()
                    if error.kind is not ErrorKind.UNAVAILABLE:
                        return failed
                    now = self.clock.now()
                    deadline = now + self.seconds if deadline is None else deadline
                    if now >= deadline or (stop is not None and stop.is_set()):
                        if tries > 1:
                            logger.warning(
                                "gave up after %d tries in %.1f s: %s",
                                tries,
                                self.seconds - (deadline - now),
                                error.message,
                            )
                        return failed
                    logger.info(
                        "%s; trying again for up to %.1f s more", error.message, deadline - now
                    )
                    self.clock.sleep(min(pause, deadline - now))
                    pause = min(2 * pause, LONGEST_PAUSE_SECONDS)
