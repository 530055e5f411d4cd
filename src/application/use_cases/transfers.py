"""What ExportDisk and ImportDisk share: the manager's rules on transfer modes, what the
capabilities must claim, the checked location, the sweep of dead transfers where a transfer
goes, a transfer as its metrics see it, and what every transfer goes through
(`TransferContext`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.application.ports.clock import Clock
from pyrigaud.application.ports.staging import StagingStorage
from pyrigaud.application.ports.storage_gate import StorageGate
from pyrigaud.application.ports.transfer_metrics import (
    TransferMetrics,
    TransferPhase,
    UncountedTransfers,
)
from pyrigaud.application.use_cases.capabilities import require, require_listed
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import TRANSFER_DEADLINE_SECONDS
from pyrigaud.domain.models import Capabilities, ExportRequest, ImportRequest, TransferMode
from pyrigaud.domain.staging import StagedLocation

# Staged temporaries older than this belong to dead transfers.
ABANDONED_AFTER_SECONDS = 2 * TRANSFER_DEADLINE_SECONDS
UNCOUNTED = UncountedTransfers()
T = TypeVar("T")
Move = TypeVar("Move", ExportRequest, ImportRequest)

logger = logging.getLogger(__name__)


def carried(request: Move) -> Result[Move, ProviderError]:
    """`request` with its transfer mode as it is carried out."""
    return Result.do(request.model_copy(update={"mode": mode}) for mode in carried_mode(request))


def carried_mode(request: ExportRequest | ImportRequest) -> Result[TransferMode, ProviderError]:
    """How the transfer is carried out, by the manager's rules, before what this backend
    supports: a direct transfer through a staging type the hypervisor cannot reach itself (its
    options say: pvc and s3) is bad input, and a direct one through a type it can (NFS), which
    the manager passes on as asked (its relay gate exempts NFS), is carried out as relay, as
    upstream's providers do."""
    if request.mode is not TransferMode.DIRECT:
        return Success(request.mode)
    if not request.staged.options.reached_by_hypervisor:
        return Failure(
            ProviderError.invalid_spec(
                fields.TRANSFER_MODE,
                f"'direct' cannot be used with {fields.STAGING_TYPE} "
                f"{request.staging_type!r}; use 'relay' (or 'auto')",
                mentions=(fields.STAGING_TYPE,),
            )
        )
    logger.info("a direct transfer through %s is carried out as relay", request.staging_type)
    return Success(TransferMode.RELAY)


def claimed(
    request: ExportRequest | ImportRequest, caps: Capabilities
) -> Result[None, ProviderError]:
    """UNSUPPORTED unless `caps` claim the disk export or import with the request's format,
    staging type and mode: what GetCapabilities told the manager."""
    if isinstance(request, ExportRequest):
        what, supported = "export", caps.supports_disk_export
        formats, backends = caps.supported_export_formats, caps.supported_export_backends
    else:
        what, supported = "import", caps.supports_disk_import
        formats, backends = caps.supported_import_formats, caps.supported_import_backends
    return Result.do(
        None
        for _ in require(supported, f"disk {what}")
        for _ in require_listed(request.format, formats, "format")
        for _ in require_listed(request.staging_type, backends, f"{what} backend")
        for _ in require_listed(request.mode.value, caps.supported_transfer_modes, "transfer mode")
    )


def sweep_dead_transfers(
    staging: StagingStorage, location: StagedLocation, older_than_seconds: float
) -> None:
    """Where a transfer goes, the staged temporaries of dead ones go first (the periodic sweep
    cannot reach a bucket or an NFS export it was never told about)."""
    match staging.sweep(location, older_than_seconds):
        case Failure(error):
            logger.warning("could not sweep staged leftovers: %s", error)
        case Success(int() as removed) if removed:
            logger.info("removed %d abandoned staged temporaries", removed)


class Watched:
    """One transfer as its metrics see it: started now, the phase it is in (where a failure
    is counted), its bytes as they pass, and its end, as the block it runs in (a `with` adds
    no frame while the transfer runs): its outcome is `counted`."""

    def __init__(
        self, metrics: TransferMetrics, direction: str, location: StagedLocation, clock: Clock
    ) -> None:
        self._metrics = metrics
        self._direction = direction
        self._storage = location.staging_type
        self.clock = clock  # what the transfer's progress lines time it by too
        self._started = clock.monotonic()
        self._bytes = 0
        self.phase = TransferPhase.OPEN

    def __enter__(self) -> Watched:
        self._metrics.started(self._direction, self._storage)
        self._failed_in: TransferPhase | None = self.phase  # an exception (a bug) counts here
        return self

    def counted(self, result: Result[T, ProviderError]) -> Result[T, ProviderError]:
        """`result`, the transfer's outcome: a Failure counts as failed in the phase it is in."""
        match result:
            case Success(_):
                self._failed_in = None
            case Failure(_):
                self._failed_in = self.phase
        return result

    def __exit__(self, *_raised: object) -> None:
        self._metrics.ended(
            self._direction,
            self._storage,
            seconds=self.clock.monotonic() - self._started,
            size_bytes=self._bytes,
            failed_in=self._failed_in,
        )

    def moved(self, count: int) -> None:
        self._bytes += count
        self._metrics.moved(self._direction, self._storage, count)


@dataclass(frozen=True)
class TransferContext:
    """What every transfer of this provider goes through, whichever its way: the staging
    stores, the gate that admits the location a request names, the clock it is timed by, when
    staged temporaries count as abandoned (swept where a transfer goes) and what its metrics
    count."""

    staging: StagingStorage
    storage_gate: StorageGate
    clock: Clock
    abandoned_after_seconds: float = ABANDONED_AFTER_SECONDS
    metrics: TransferMetrics = UNCOUNTED

    def admitted(
        self, request: Move, allowed: Callable[[Move], Result[None, ProviderError]]
    ) -> Result[tuple[Move, StagedLocation], ProviderError]:
        """`request` with its mode as it is carried out (`carried`), if what this backend
        claims `allowed` it so, and its staged location as the storage gate admits it (its
        host resolved, checked and pinned)."""
        return Result.do(
            (carried_request, location)
            for carried_request in carried(request)
            for _ in allowed(carried_request)
            for location in self.storage_gate.admitted(request.staged)
        )

    def watched(self, direction: str, location: StagedLocation) -> Watched:
        """One transfer, `direction` "export" or "import", to or from `location`."""
        return Watched(self.metrics, direction, location, self.clock)

    def sweep(self, location: StagedLocation) -> None:
        """The staged temporaries of dead transfers where `location` is, gone."""
        sweep_dead_transfers(self.staging, location, self.abandoned_after_seconds)
