"""One StagingStorage for every staging type: each location goes to the adapter of its type.

`staging_by_type` builds the set this machine can serve: S3 needs the `s3` extra (boto3),
NFS needs libnfs (Debian 12's libnfs13 or Debian 13's libnfs14); a type without them is
left out, so it answers UNSUPPORTED and is not advertised. The sweep with no request in hand
visits every mounted PVC and the staging places the operator named (S3 buckets and NFS exports
are otherwise known only from requests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.libnfs import LibnfsMissingError, library
from pyrigaud.adapters.staging.nfs import NfsStaging
from pyrigaud.adapters.staging.patience import STAGING_RETRY_SECONDS
from pyrigaud.adapters.staging.pvc import MIGRATION_STORAGE_ROOT, PvcStaging
from pyrigaud.application.ports.clock import Clock
from pyrigaud.application.ports.staging import StagedReader, StagedWriter, StagingStorage
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import StagingType
from pyrigaud.domain.staging import StagedLocation, StagedSweep, parse_staging_place


@dataclass(frozen=True)
class StagingPlace:
    """A staging place the sweep visits with no request naming it: the manager's staging type
    (backend_type) and storage options for it, and its credentials, read at each visit (a
    mounted Secret may have changed since)."""

    staging_type: StagingType
    options: Mapping[str, object]
    credentials: Callable[[], Mapping[str, str]] = field(default=dict)


class StagingByType:
    """Dispatch by `location.staging_type`; a type without an adapter here is UNSUPPORTED."""

    def __init__(
        self,
        adapters: Mapping[StagingType, StagingStorage],
        pvc: PvcStaging | None = None,
        places: Sequence[StagingPlace] = (),
        aborts: DeferredAborts | None = None,
    ) -> None:
        self._adapters = dict(adapters)
        self._pvc = pvc
        self._places = tuple(places)
        self._aborts = aborts

    @property
    def types(self) -> tuple[StagingType, ...]:
        """What this provider can stage to (what GetCapabilities should advertise)."""
        return tuple(kind for kind in StagingType if kind in self._adapters)

    def deferred_aborts(self) -> int:
        """Aborts of failed transfers waiting for their store to answer again."""
        return self._aborts.pending() if self._aborts is not None else 0

    def open_read(self, location: StagedLocation) -> Result[StagedReader, ProviderError]:
        adapter = self._adapters.get(location.staging_type)
        if adapter is None:
            return Failure(_unsupported(location))
        return adapter.open_read(location)

    def open_write(
        self, location: StagedLocation, size_bytes: int | None = None
    ) -> Result[StagedWriter, ProviderError]:
        adapter = self._adapters.get(location.staging_type)
        if adapter is None:
            return Failure(_unsupported(location))
        return adapter.open_write(location, size_bytes)

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        adapter = self._adapters.get(location.staging_type)
        if adapter is None:
            return Failure(_unsupported(location))
        return adapter.sweep(location, older_than_seconds)

    def sweep_reachable(self, older_than_seconds: float) -> StagedSweep:
        """The staged temporaries a sweep can find with no request naming a place: those on
        every PVC mounted under the root and in each configured place. Elsewhere on S3 and
        NFS, each transfer sweeps its own folder before it starts."""
        removed, failures = 0, []
        for swept in self._sweep_each_place(older_than_seconds):
            match swept:
                case Success(count):
                    removed += count
                case Failure(error):
                    failures.append(error)
        return StagedSweep(removed=removed, failures=tuple(failures))

    def _sweep_each_place(self, older_than_seconds: float) -> Iterator[Result[int, ProviderError]]:
        if self._pvc is not None:
            yield self._pvc.sweep_mounted(older_than_seconds)
        for place in self._places:
            yield parse_staging_place(place.staging_type, place.options, place.credentials()).bind(
                lambda location: self.sweep(location, older_than_seconds)
            )


def _unsupported(location: StagedLocation) -> ProviderError:
    return ProviderError.unsupported(
        f"backend_type {location.staging_type.value!r}: this provider cannot stage disks there"
    )


def staging_by_type(
    owner: str,
    clock: Clock,
    pvc_root: str = MIGRATION_STORAGE_ROOT,
    places: Sequence[StagingPlace] = (),
    retry_seconds: float = STAGING_RETRY_SECONDS,
) -> StagingByType:
    """`retry_seconds`: how long S3 and NFS transfers wait out a store that stopped answering
    (per part, read or write)."""
    pvc = PvcStaging(root=pvc_root, owner=owner, clock=clock)
    aborts = DeferredAborts(clock)  # one thread and one bound for the whole provider
    adapters: dict[StagingType, StagingStorage] = {StagingType.PVC: pvc}
    try:
        library()
        adapters[StagingType.NFS] = NfsStaging(
            owner=owner, clock=clock, retry_seconds=retry_seconds, aborts=aborts
        )
    except LibnfsMissingError:
        pass
    try:
        from pyrigaud.adapters.staging.s3 import S3Staging  # noqa: PLC0415 - an optional extra
    except ImportError:
        return StagingByType(adapters, pvc, places, aborts)
    adapters[StagingType.S3] = S3Staging(
        owner=owner, clock=clock, retry_seconds=retry_seconds, aborts=aborts
    )
    return StagingByType(adapters, pvc, places, aborts)
