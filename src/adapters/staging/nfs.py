"""Staged objects on an NFS export, through libnfs in this process: no kernel mount.

Provider pods have no privilege to mount (and these machines no NFS client in the kernel), so
the bytes travel over libnfs's userspace NFSv3 client as the URL's uid/gid (AUTH_SYS), as
qemu-img's `nfs://` driver would. The manager's names are flat (libnfs cannot make folders), so
a writer creates its marked temporary beside the final file, fsyncs it (an NFS COMMIT) and
renames it over the final name on the server (atomic there). A server that cannot be reached
or mounted is UNAVAILABLE; a refused uid/gid is PERMISSION_DENIED.

A server that stops answering mid-transfer (restarted, failing over) is waited out: each read
or write is tried again on a new mount, at its offset, for up to the staging retry budget
(`Patience`); past it the transfer is UNAVAILABLE and a writer's temporary is removed once
the server answers again (`DeferredAborts`), or by the leftover sweep.

Reading and writing a file through its mounts: `nfs_files.py`; libnfs's answers as this
provider's errors: `nfs_calls.py`.
"""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import dataclass, field

from returns.result import Failure, Result, Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.libnfs import Handle, LibnfsMissingError, NfsSession, library
from pyrigaud.adapters.staging.nfs_calls import in_session, nfs_call, nfs_path
from pyrigaud.adapters.staging.nfs_files import NfsReader, NfsWriter, OpenFile, first_use
from pyrigaud.adapters.staging.patience import STAGING_RETRY_SECONDS, Patience
from pyrigaud.adapters.staging.rules import StoreContext
from pyrigaud.adapters.staging.streams import CHUNK_BYTES
from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.staging import StagedLocation
from pyrigaud.domain.staging_names import sweepable, temporary_name

FILE_MODE = 0o640


def nfs_store(context: StoreContext) -> NfsStaging | None:
    """The nfs type's store, where libnfs is installed (Debian 12's libnfs13 or 13's
    libnfs14)."""
    try:
        library()
    except LibnfsMissingError:
        return None
    return NfsStaging(
        owner=context.owner,
        clock=context.clock,
        retry_seconds=context.retry_seconds,
        aborts=context.aborts,
        companion_suffixes=context.companion_suffixes,
    )


@dataclass(frozen=True)
class NfsStaging:
    """NFS staging; one libnfs mount per opened object, as the request's uid/gid."""

    owner: str = "pyrigaud"
    clock: Clock = field(default_factory=SystemClock)
    chunk_bytes: int = CHUNK_BYTES
    retry_seconds: float = STAGING_RETRY_SECONDS  # per read or write (module docstring)
    # Where aborts the store did not answer wait (shared by a provider's adapters).
    aborts: DeferredAborts = field(
        default_factory=lambda: DeferredAborts(SystemClock()), compare=False, repr=False
    )
    companion_suffixes: tuple[str, ...] = ()  # what the sweep removes once its object is gone

    def open_read(self, location: StagedLocation) -> Result[NfsReader, ProviderError]:
        patience = Patience(self.clock, self.retry_seconds)
        identity: list[tuple[int, int]] = []  # the file's, from its first opening

        def reopened(session: NfsSession, path: str) -> Result[Handle, ProviderError]:
            def same_file(handle: Handle, found: tuple[int, int]) -> Result[Handle, ProviderError]:
                if identity and found != identity[0]:
                    match nfs_call(location, "read", functools.partial(session.close_file, handle)):
                        case Failure() as failed:
                            return failed
                    return Failure(
                        ProviderError.failed_precondition(
                            f"cannot read {location.url}: it was replaced while being read"
                        )
                    )
                identity[:] = [found]
                return Success(handle)

            return Result.do(
                same
                for handle in nfs_call(
                    location, "read", functools.partial(session.open, path, os.O_RDONLY)
                )
                for found in nfs_call(location, "read", functools.partial(session.identity, handle))
                for same in same_file(handle, found)
            )

        def reader(_opened: None) -> NfsReader:
            return NfsReader(file, location, self.chunk_bytes, patience, identity[0][1])

        file = OpenFile(location, nfs_path(location.key), reopened)
        return first_use(file, patience, f"read {location.url}", "read", file.drop).map(reader)

    def open_file(self, location: StagedLocation) -> Result[None, ProviderError]:
        """An NFS file is no local file here (nothing mounts it): an image made out of order
        is written with `open_write`."""
        del location
        return Success(None)

    def open_write(
        self, location: StagedLocation, size_bytes: int | None = None
    ) -> Result[NfsWriter, ProviderError]:
        del size_bytes  # a file needs no plan
        started = self.clock.now()
        name = temporary_name(location.name, self.owner, started, secrets.token_hex(4))
        temporary = nfs_path(f"{location.parent}/{name}" if location.parent else name)
        patience = Patience(self.clock, self.retry_seconds)
        created: list[bool] = []

        def create(session: NfsSession, path: str) -> Result[Handle, ProviderError]:
            # The name is this writer's own: a create tried again after its answer was
            # lost finds the file it made, empty, and makes it anew.
            made = nfs_call(
                location,
                "write",
                functools.partial(session.create, path, FILE_MODE, exclusive=not created),
            )
            match made:
                case Success(_):
                    created.append(True)
            return made

        def failed() -> None:
            file.drop()
            created.append(True)

        file = OpenFile(location, temporary, create)

        def reopened(session: NfsSession, path: str) -> Result[Handle, ProviderError]:
            return nfs_call(location, "write", functools.partial(session.open, path, os.O_WRONLY))

        def opened(_: None) -> NfsWriter:
            file.reopen_with(reopened)
            return NfsWriter(file, temporary, location, patience, self.aborts)

        return first_use(file, patience, f"write {location.url}", "write", failed).map(opened)

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        """This provider's abandoned temporaries in the location's folder on the export, and
        the companions there whose object is gone (`sweepable`)."""
        deadline = self.clock.now() - older_than_seconds

        def swept(session: NfsSession) -> Result[int, ProviderError]:
            folder = nfs_path(location.parent)
            match nfs_call(location, "sweep", functools.partial(_names_in, session, folder)):
                case Failure() as failed:
                    return failed
                case Success(names):
                    pass
            stale, orphans = sweepable(names, self.owner, deadline, self.companion_suffixes)
            removed = 0
            for name in (*stale, *orphans):
                path = f"{folder.rstrip('/')}/{name}"
                match nfs_call(location, "sweep", functools.partial(session.unlink, path)):
                    case Success(_):
                        removed += 1
                    case Failure(error) as failed if error.kind is not ErrorKind.NOT_FOUND:
                        return failed  # NOT_FOUND: another's sweep took it
            return Success(removed)

        return in_session(location, swept)


def _names_in(session: NfsSession, folder: str) -> list[str]:
    """The folder's names, all read inside the call whose failures become values."""
    return list(session.names(folder))
