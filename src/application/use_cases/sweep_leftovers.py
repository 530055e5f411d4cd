"""Remove what Creates and disk transfers killed part-way left behind, once none of them can
still be running."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from returns.result import Failure, Result, Success

from pyrigaud.application.ports import Clock, VMLifecycle
from pyrigaud.application.ports.disk_transfer import TransferLeftovers
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import LeftoverPolicy


class SweepReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    removed: tuple[str, ...] = ()  # names of the leftover VMs removed
    removed_transfer_volumes: tuple[str, ...] = ()  # temporary volumes of dead transfers
    failures: tuple[ProviderError, ...] = ()  # one per leftover that could not be removed


class SweepLeftovers:
    """Only this provider's unfinished VMs older than the Create deadline are touched, so one
    replica's sweep never removes another replica's work in progress."""

    def __init__(
        self,
        lifecycle: VMLifecycle,
        clock: Clock,
        leftovers: LeftoverPolicy,
        transfers: TransferLeftovers | None = None,
    ) -> None:
        self._lifecycle = lifecycle
        self._clock = clock
        self._leftovers = leftovers
        self._transfers = transfers

    def __call__(self) -> Result[SweepReport, ProviderError]:
        match self._lifecycle.find_unfinished():
            case Failure(error):
                return Failure(error)
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
        volumes: tuple[str, ...] = ()
        if self._transfers is not None:
            older_than = self._leftovers.transfer_abandoned_after_seconds
            match self._transfers.sweep_transfer_leftovers(older_than):
                case Failure(error):
                    failures.append(error)
                case Success(volumes):
                    pass
        return Success(
            SweepReport(
                removed=tuple(removed),
                removed_transfer_volumes=volumes,
                failures=tuple(failures),
            )
        )
