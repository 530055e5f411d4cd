"""What an operator watches of disk transfers: bytes moving, transfers in flight, how long they
took, and where the failed ones failed."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from pyrigaud.domain.disk_images import LeftBehind


class TransferPhase(StrEnum):
    """Where a transfer failed: opening its ends (the disk, the staged object, the landing
    site), reading, writing, verifying (the image judged, the checksum compared, an earlier
    import's record) or committing (the staged object or the disk made, the record kept)."""

    OPEN = "open"
    READ = "read"
    WRITE = "write"
    VERIFY = "verify"
    COMMIT = "commit"


class TransferMetrics(Protocol):
    """One transfer is `started`, `moved` as its bytes pass, then `ended` once."""

    def started(self, direction: str, storage: str) -> None: ...

    def moved(self, direction: str, storage: str, count: int) -> None: ...

    def left_behind(self, storage: str, what: LeftBehind) -> None:
        """An export that does not take `what` of its VM along."""
        ...

    def ended(
        self,
        direction: str,
        storage: str,
        *,
        seconds: float,
        size_bytes: int,
        failed_in: TransferPhase | None,
    ) -> None:
        """`failed_in` is None for a transfer that succeeded."""
        ...


class UncountedTransfers:
    """TransferMetrics where nobody watches (a use case built outside a server)."""

    def started(self, direction: str, storage: str) -> None:
        del direction, storage

    def moved(self, direction: str, storage: str, count: int) -> None:
        del direction, storage, count

    def left_behind(self, storage: str, what: LeftBehind) -> None:
        del storage, what

    def ended(
        self,
        direction: str,
        storage: str,
        *,
        seconds: float,
        size_bytes: int,
        failed_in: TransferPhase | None,
    ) -> None:
        del direction, storage, seconds, size_bytes, failed_in
