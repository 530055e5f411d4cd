"""Remove what Creates and disk transfers killed part-way left behind, once none of them can
still be running."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from returns.result import Failure, Result, Success

from pyrigaud.application.ports import Clock, VMLifecycle
from pyrigaud.application.ports.disk_transfer import TransferLeftovers
from pyrigaud.application.ports.staging import StagedLeftovers
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.staging import StagedSweep


class SweepReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    removed: tuple[str, ...] = ()  # names of the leftover VMs removed
    removed_transfer_volumes: tuple[str, ...] = ()  # temporary volumes of dead transfers
    removed_staged: int = 0  # staged temporaries of dead transfers (files, S3 uploads)
    failures: tuple[ProviderError, ...] = ()  # one per leftover or place that failed


class SweepLeftovers:
    """Only this provider's unfinished VMs older than the Create deadline, and its transfer
    temporaries older than twice the transfer deadline, are touched, so one replica's sweep
    never removes another replica's work in progress. Staged temporaries are the staging
    storage's, whatever the backend."""

    def __init__(
        self,
        lifecycle: VMLifecycle,
        clock: Clock,
        leftovers: LeftoverPolicy,
        transfers: TransferLeftovers | None = None,
        staging: StagedLeftovers | None = None,
    ) -> None:
        self._lifecycle = lifecycle
        self._clock = clock
        self._leftovers = leftovers
        self._transfers = transfers
        self._staging = staging

    def __call__(self) -> Result[SweepReport, ProviderError]:
        match self._lifecycle.find_unfinished():
            case Failure() as failed:
                return failed
            case Success(unfinished):
                pass
        now = self._clock.now()
        removed: list[str] = []
        failures: list[ProviderError] = []
        for record in unfinished:
            if not self._leftovers.is_abandoned(record, now):
                continue
            match self._lifecycle.delete(record.id):
                case Failure(error):
                    failures.append(error)
                case Success(_):
                    removed.append(record.name)
        older_than = self._leftovers.transfer_abandoned_after_seconds
        volumes: tuple[str, ...] = ()
        if self._transfers is not None:
            match self._transfers.sweep_transfer_leftovers(older_than):
                case Failure(error):
                    failures.append(error)
                case Success(volumes):
                    pass
        staged = StagedSweep()
        if self._staging is not None:
            staged = self._staging.sweep_reachable(older_than)
        return Success(
            SweepReport(
                removed=tuple(removed),
                removed_transfer_volumes=volumes,
                removed_staged=staged.removed,
                failures=(*failures, *staged.failures),
            )
        )
