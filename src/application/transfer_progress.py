"""A transfer's log lines (start, every 256 MiB with throughput, end) and its stop when the
caller is gone: the `TransferWatch` a use case hands the hypervisor's part, built over the
RPC's cancellation scope. Lines name the staged URL's backend and object, never a credential
(the credentials travel beside the URL, never in it: the location refuses a URL that holds
some)."""

from __future__ import annotations

import logging

from returns.result import Result

from pyrigaud.application.cancellation import call_active
from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedDigest, StagedLocation

PROGRESS_EVERY_BYTES = 256 * 1024**2
MiB = 1024**2

logger = logging.getLogger("pyrigaud.transfer")


class TransferProgress:
    """One transfer: `doing` (e.g. "export of VM 'web'") to or from `location`; or, not
    `announced`, one part of one (the disk read into the pod before it is staged), whose
    bytes are counted apart from the staged ones."""

    def __init__(
        self, doing: str, location: StagedLocation, clock: Clock, *, announced: bool = True
    ) -> None:
        self.doing = doing
        self._where = f"{location.staging_type} {location.container}/{location.key}"
        self._clock = clock
        self._started = clock.monotonic()
        self._done = 0
        if announced:
            logger.info("%s: started (%s)", doing, self._where)

    def add(self, count: int) -> Result[None, ProviderError]:
        """`count` more bytes moved; a line at every PROGRESS_EVERY_BYTES; UNAVAILABLE once
        the RPC's client cancelled or its deadline passed (the transfer stops there)."""
        before, self._done = self._done, self._done + count
        if self._done // PROGRESS_EVERY_BYTES > before // PROGRESS_EVERY_BYTES:
            seconds = max(self._clock.monotonic() - self._started, 1e-6)
            logger.info(
                "%s: %d MiB so far, %.1f MiB/s",
                self.doing,
                self._done // MiB,
                self._done / MiB / seconds,
            )
        return self.check()

    def check(self) -> Result[None, ProviderError]:
        """UNAVAILABLE once the RPC's client cancelled or its deadline passed."""
        return call_active(self.doing)

    def finished(self, digest: StagedDigest) -> None:
        seconds = self._clock.monotonic() - self._started
        logger.info(
            "%s: done, %d bytes in %.1f s (%.1f MiB/s), sha256 %s",
            self.doing,
            digest.size_bytes,
            seconds,
            digest.size_bytes / MiB / max(seconds, 1e-6),
            digest.sha256,
        )
