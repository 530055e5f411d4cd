"""Every staging type this provider knows, one line each, and one StagingStorage for them all.

`STAGING_KINDS` maps the manager's name of each type (its `backend_type`) to the type's rules
(URL, options, credentials, sweep place: `<type>_location.py`) and its store's builder. It is
the only list of types: the wire reads a request's location through it, the sweep's settings
their places, and `staging_by_type` builds the stores this machine can serve (S3 needs the
`s3` extra, NFS needs libnfs); a type without its store is left out, so it answers
UNSUPPORTED and is not advertised. The sweep with no request in hand visits what each store
finds by itself (every mounted PVC) and the staging places the operator named (S3 buckets and
NFS exports are otherwise known only from requests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, runtime_checkable

from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.nfs import nfs_store
from pyrigaud.adapters.staging.nfs_location import NFS, NfsRules
from pyrigaud.adapters.staging.patience import STAGING_RETRY_SECONDS
from pyrigaud.adapters.staging.pvc import MIGRATION_STORAGE_ROOT, pvc_store
from pyrigaud.adapters.staging.pvc_location import PVC, PvcRules
from pyrigaud.adapters.staging.rules import (
    DECLARED_TYPE,
    StagingKind,
    StagingRules,
    StoreContext,
    declared_type,
    invalid,
    parse_place,
    parse_url,
    readable,
)
from pyrigaud.adapters.staging.s3_location import S3, S3Rules, s3_store
from pyrigaud.application.ports.clock import Clock
from pyrigaud.application.ports.staging import (
    StagedFile,
    StagedReader,
    StagedWriter,
    StagingStorage,
)
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedLocation, StagedSweep, StagingType

# In the order GetCapabilities lists them; a request that names no type means the first.
STAGING_KINDS: Mapping[StagingType, StagingKind] = {
    PVC: StagingKind(PvcRules(), pvc_store),
    NFS: StagingKind(NfsRules(), nfs_store),
    S3: StagingKind(S3Rules(), s3_store),
}
DEFAULT_STAGING_TYPE = next(iter(STAGING_KINDS))


def staging_rules(name: str) -> StagingRules[Any] | None:
    """The rules of the type the manager calls `name`, if this provider knows it."""
    kind = STAGING_KINDS.get(StagingType(name))
    return None if kind is None else kind.rules


def known_types() -> str:
    """The known types' names, for a refusal: `pvc, nfs or s3`."""
    *first, last = STAGING_KINDS
    return f"{', '.join(first)} or {last}" if first else last


def option_keys() -> tuple[str, ...]:
    """Every storage option key a type reads, and `backend`, which names the type itself."""
    keys = (key for kind in STAGING_KINDS.values() for key in kind.rules.option_keys)
    return tuple(dict.fromkeys((DECLARED_TYPE, *keys)))


def types_taking_credentials() -> tuple[StagingType, ...]:
    return tuple(name for name, kind in STAGING_KINDS.items() if kind.rules.takes_credentials)


def parse_staged_location(
    field: str,
    url: str,
    staging_type: StagingType,
    options: Mapping[str, object],
    credentials: Mapping[str, str] | None,
) -> Result[StagedLocation, ProviderError]:
    """The location `url` (the request's `field`) names on `staging_type`, or the first
    problem; None `credentials` are read later, at each use."""
    rules = staging_rules(staging_type)
    if rules is None:
        return invalid(fields.STAGING_TYPE, f"must be {known_types()}")
    return parse_url(field, url, rules, options, credentials, others=_others(rules))


def parse_staging_place(
    staging_type: StagingType,
    options: Mapping[str, object],
    credentials: Mapping[str, str] | None,
) -> Result[StagedLocation, ProviderError]:
    """The folder where the manager stages every migration's objects with these storage
    options, as the location of an object in it: what a sweep of that place takes. A PVC is no
    place to name: every mounted one is swept already."""
    rules = staging_rules(staging_type)
    if rules is None:
        return invalid(fields.STAGING_TYPE, f"must be {known_types()}")

    def placed() -> Result[StagedLocation, ProviderError]:
        if not rules.no_place:
            return parse_place(rules, options, credentials)
        # Listed s3 first, as this refusal has always read.
        sweepable = sorted(
            (name for name, kind in STAGING_KINDS.items() if not kind.rules.no_place),
            reverse=True,
        )
        return invalid(fields.STAGING_TYPE, f"must be {' or '.join(sweepable)} ({rules.no_place})")

    return Result.do(
        location
        for _ in declared_type(options, staging_type)
        for _ in readable(options, (rules, *_others(rules)))
        for location in placed()
    )


def _others(rules: StagingRules[Any]) -> tuple[StagingRules[Any], ...]:
    """Every other type's rules, which read the same options (`rules.readable`)."""
    return tuple(kind.rules for kind in STAGING_KINDS.values() if kind.rules is not rules)


@runtime_checkable
class SweptWithoutPlace(Protocol):
    """A store that finds its objects with no request naming them (PVC: every mounted one)."""

    def sweep_mounted(self, older_than_seconds: float) -> StagedSweep: ...


@dataclass(frozen=True)
class StagingPlace:
    """A staging place the sweep visits with no request naming it: the manager's staging type
    (backend_type) and storage options for it, and its credentials, read at each visit (a
    mounted Secret may have changed since)."""

    staging_type: StagingType
    options: Mapping[str, object]
    credentials: Callable[[], Mapping[str, str]] = field(default=dict)


class StagingByType:
    """Dispatch by `location.staging_type`; a type without a store here is UNSUPPORTED."""

    def __init__(
        self,
        adapters: Mapping[StagingType, StagingStorage],
        places: Sequence[StagingPlace] = (),
        aborts: DeferredAborts | None = None,
    ) -> None:
        self._adapters = dict(adapters)
        self._places = tuple(places)
        self._aborts = aborts

    @property
    def types(self) -> tuple[StagingType, ...]:
        """What this provider can stage to (what GetCapabilities should advertise)."""
        return tuple(name for name in STAGING_KINDS if name in self._adapters)

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

    def open_file(self, location: StagedLocation) -> Result[StagedFile | None, ProviderError]:
        adapter = self._adapters.get(location.staging_type)
        if adapter is None:
            return Failure(_unsupported(location))
        return adapter.open_file(location)

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        adapter = self._adapters.get(location.staging_type)
        if adapter is None:
            return Failure(_unsupported(location))
        return adapter.sweep(location, older_than_seconds)

    def sweep_reachable(self, older_than_seconds: float) -> StagedSweep:
        """The staged temporaries, and companions whose object is gone, that a sweep can find
        with no request naming a place: those each store finds by itself (every PVC mounted
        under the root) and in each configured place. Elsewhere on S3 and NFS, each transfer
        sweeps its own folder before it starts. One place that cannot be swept is reported
        and does not stop the others."""
        removed, failures = 0, list[ProviderError]()
        for adapter in self._adapters.values():
            if isinstance(adapter, SweptWithoutPlace):
                mounted = adapter.sweep_mounted(older_than_seconds)
                removed += mounted.removed
                failures.extend(mounted.failures)
        for swept in self._sweep_each_place(older_than_seconds):
            match swept:
                case Success(count):
                    removed += count
                case Failure(error):
                    failures.append(error)
        return StagedSweep(removed=removed, failures=tuple(failures))

    def _sweep_each_place(self, older_than_seconds: float) -> Iterator[Result[int, ProviderError]]:
        for place in self._places:
            yield parse_staging_place(place.staging_type, place.options, place.credentials()).bind(
                partial(self.sweep, older_than_seconds=older_than_seconds)
            )


def _unsupported(location: StagedLocation) -> ProviderError:
    return ProviderError.unsupported(
        f"{fields.STAGING_TYPE} {location.staging_type!r}: this provider cannot stage disks there"
    ).mentioning(fields.STAGING_TYPE)


def staging_by_type(
    owner: str,
    clock: Clock,
    pvc_root: str = MIGRATION_STORAGE_ROOT,
    places: Sequence[StagingPlace] = (),
    *,
    retry_seconds: float = STAGING_RETRY_SECONDS,
    companion_suffixes: tuple[str, ...] = (),
) -> StagingByType:
    """Every type's store this machine can build. `retry_seconds`: how long S3 and NFS
    transfers wait out a store that stopped answering (per part, read or write);
    `companion_suffixes`: the objects staged beside another (`<object><suffix>`) that the
    sweeps remove once their object is gone."""
    aborts = DeferredAborts(clock)  # one thread and one bound for the whole provider
    context = StoreContext(owner, clock, retry_seconds, aborts, pvc_root, companion_suffixes)
    adapters = {name: kind.store(context) for name, kind in STAGING_KINDS.items()}
    served = {name: store for name, store in adapters.items() if store is not None}
    return StagingByType(served, places, aborts)
