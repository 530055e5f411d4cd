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
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.libnfs import (
    Handle,
    LibnfsMissingError,
    NfsError,
    NfsSession,
    library,
)
from pyrigaud.adapters.staging.nfs_location import nfs_options
from pyrigaud.adapters.staging.patience import STAGING_RETRY_SECONDS, Patience
from pyrigaud.adapters.staging.rules import StoreContext
from pyrigaud.adapters.staging.streams import CHUNK_BYTES, RunningDigest, TemporaryWriter
from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.staging import StagedDigest, StagedLocation
from pyrigaud.domain.staging_names import temporary_name, temporary_started_at

FILE_MODE = 0o640
HELD_BYTES = 16 * 1024 * 1024  # written but not yet COMMITted: resent after a reconnection
T = TypeVar("T")


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

    def open_read(self, location: StagedLocation) -> Result[NfsReader, ProviderError]:
        patience = Patience(self.clock, self.retry_seconds)
        identity: list[tuple[int, int]] = []  # the file's, from its first opening

        def reopened(session: NfsSession, path: str) -> Result[Handle, ProviderError]:
            def same_file(handle: Handle, found: tuple[int, int]) -> Result[Handle, ProviderError]:
                if identity and found != identity[0]:
                    return _nfs(location, "read", lambda: session.close_file(handle)).bind(
                        lambda _: Failure(
                            ProviderError.failed_precondition(
                                f"cannot read {location.url}: it was replaced while being read"
                            )
                        )
                    )
                identity[:] = [found]
                return Success(handle)

            return _nfs(location, "read", lambda: session.open(path, os.O_RDONLY)).bind(
                lambda handle: _nfs(location, "read", lambda: session.identity(handle)).bind(
                    lambda found: same_file(handle, found)
                )
            )

        file = _OpenFile(location, _path(location.key), reopened)
        return _first_use(file, patience, f"read {location.url}", "read", file.drop).map(
            lambda _: NfsReader(file, location, self.chunk_bytes, patience, identity[0][1])
        )

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
        temporary = _path(f"{location.parent}/{name}" if location.parent else name)
        patience = Patience(self.clock, self.retry_seconds)
        created: list[bool] = []

        def create(session: NfsSession, path: str) -> Result[Handle, ProviderError]:
            # The name is this writer's own: a create tried again after its answer was
            # lost finds the file it made, empty, and makes it anew.
            made = _nfs(
                location, "write", lambda: session.create(path, FILE_MODE, exclusive=not created)
            )
            match made:
                case Success(_):
                    created.append(True)
            return made

        def failed() -> None:
            file.drop()
            created.append(True)

        file = _OpenFile(location, temporary, create)

        def opened(_: None) -> NfsWriter:
            file.reopen_with(
                lambda session, path: _nfs(
                    location, "write", lambda: session.open(path, os.O_WRONLY)
                )
            )
            return NfsWriter(file, temporary, location, patience, self.aborts)

        return _first_use(file, patience, f"write {location.url}", "write", failed).map(opened)

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        """This provider's abandoned temporaries in the location's folder on the export."""
        deadline = self.clock.now() - older_than_seconds

        def swept(session: NfsSession) -> Result[int, ProviderError]:
            folder = _path(location.parent)
            match _nfs(location, "sweep", lambda: list(session.names(folder))):
                case Failure(error):
                    return Failure(error)
                case Success(names):
                    pass
            removed = 0
            for name in names:
                started = temporary_started_at(name, self.owner)
                if started is None or started > deadline:
                    continue
                path = f"{folder.rstrip('/')}/{name}"
                match _nfs(location, "sweep", functools.partial(session.unlink, path)):
                    case Success(_):
                        removed += 1
                    case Failure(error) if error.kind is not ErrorKind.NOT_FOUND:
                        return Failure(error)  # NOT_FOUND: another's sweep took it
            return Success(removed)

        return _in_session(location, swept)


def _first_use(
    file: _OpenFile, patience: Patience, doing: str, action: str, after_failure: Callable[[], None]
) -> Result[None, ProviderError]:
    """The file mounted and opened (tried again within the budget); dropped when it is not."""
    try:
        used = patience.retried(
            doing,
            lambda: file.use(action, lambda _session, _handle: None),
            after_failure=after_failure,
        )
    except BaseException:
        file.drop()
        raise
    match used:
        case Failure(_):
            file.drop()
    return used


class _OpenFile:
    """A file on the export through a mount of its own, mounted and opened again (by
    `opening`) at the first use after a failure dropped them: each reconnection goes to the
    address the storage gate checked, as the first did."""

    def __init__(
        self,
        location: StagedLocation,
        path: str,
        opening: Callable[[NfsSession, str], Result[Handle, ProviderError]],
    ) -> None:
        self._location = location
        self._path = path
        self._opening = opening
        self._open: tuple[NfsSession, Handle] | None = None

    def reopen_with(
        self, opening: Callable[[NfsSession, str], Result[Handle, ProviderError]]
    ) -> None:
        self._opening = opening

    def use(self, action: str, call: Callable[[NfsSession, Handle], T]) -> Result[T, ProviderError]:
        return self._opened().bind(
            lambda opened: _nfs(self._location, action, lambda: call(*opened))
        )

    def _opened(self) -> Result[tuple[NfsSession, Handle], ProviderError]:
        if self._open is not None:
            return Success(self._open)
        return _mounted(self._location).bind(self._opened_on)

    def _opened_on(self, session: NfsSession) -> Result[tuple[NfsSession, Handle], ProviderError]:
        try:
            opened = self._opening(session, self._path)
        except BaseException:
            session.close()
            raise
        match opened:
            case Failure(error):
                session.close()
                return Failure(error)
            case Success(handle):
                self._open = (session, handle)
        return Success((session, handle))

    def close(self) -> Result[None, ProviderError]:
        """Close the file (its failure is answered: a write may be lost) and drop the mount."""
        if self._open is None:
            return Success(None)
        session, handle = self._open
        self._open = None
        try:
            return _nfs(self._location, "write", lambda: session.close_file(handle))
        finally:
            session.close()

    def drop(self) -> None:
        """Forget the file and its mount (broken, or done with); a later use mounts again.
        How the close went is of no interest: nothing written is kept from here."""
        self.close()


class NfsReader:
    """The file's bytes in chunks from an offset: a read the server did not answer is tried
    again, within the retry budget, on a new mount from the same offset (so no byte is
    delivered twice or missed), once the file is checked to be the one being read."""

    def __init__(
        self,
        file: _OpenFile,
        location: StagedLocation,
        chunk_bytes: int,
        patience: Patience,
        size_bytes: int,
    ) -> None:
        self._file = file
        self._location = location
        self._buffer = ctypes.create_string_buffer(chunk_bytes)
        self._patience = patience
        self._offset = 0
        self._digest = RunningDigest()
        self._closed = False
        self.size_bytes: int | None = size_bytes

    def read_chunk(self) -> Result[bytes, ProviderError]:
        if self._closed:
            return Failure(ProviderError.internal(f"{self._location.url} is closed"))
        return self._patience.retried(
            f"read {self._location.url} from byte {self._offset}",
            lambda: self._file.use("read", self._read_at_offset),
            after_failure=self._file.drop,
        ).map(self._delivering)

    def _delivering(self, chunk: bytes) -> bytes:
        self._offset += len(chunk)
        self._digest.add(chunk)
        return chunk

    def _read_at_offset(self, session: NfsSession, handle: Handle) -> bytes:
        count = session.read_into(handle, self._offset, self._buffer)
        return ctypes.string_at(self._buffer, count)

    def digest(self) -> StagedDigest:
        return self._digest.value()

    def close(self) -> None:
        self._closed = True
        self._file.drop()  # read-only: nothing to lose


class NfsWriter(TemporaryWriter):
    """Writes the temporary at increasing offsets. libnfs's writes are UNSTABLE (the server may
    hold them in memory until a COMMIT), and a server that restarts loses what it held, so the
    bytes written since the last COMMIT are held here (at most HELD_BYTES, then a COMMIT): a
    write the server did not answer is sent again, with all held bytes, on a new mount, within
    the retry budget. A COMMIT answered on the mount that wrote the bytes makes them safe."""

    def __init__(
        self,
        file: _OpenFile,
        temporary: str,
        location: StagedLocation,
        patience: Patience,
        aborts: DeferredAborts,
    ) -> None:
        super().__init__(location.url)
        self._file = file
        self._temporary = temporary
        self._location = location
        self._patience = patience
        self._aborts = aborts
        self._committed = 0  # bytes the server made safe (a COMMIT answered)
        self._sent = 0  # bytes sent on the current mount
        self._held: list[bytes] = []  # the bytes from `_committed` on
        self._held_bytes = 0
        self._store_gone = False

    def _write(self, chunk: bytes) -> Result[None, ProviderError]:
        chunk = bytes(chunk)  # held until COMMITted: a copy unless it is immutable already
        self._held.append(chunk)
        self._held_bytes += len(chunk)
        return self._patient(lambda: self._send_held(safe=self._held_bytes >= HELD_BYTES))

    def _commit(self) -> Result[None, ProviderError]:
        final = _path(self._location.key)
        renamed: list[bool] = []

        def rename() -> Result[None, ProviderError]:
            return _in_session(
                self._location,
                lambda session: _nfs(
                    self._location, "write", lambda: session.rename(self._temporary, final)
                ).lash(
                    # A rename tried again after its answer was lost finds no temporary: done.
                    lambda error: (
                        Success(None)
                        if renamed and error.kind is ErrorKind.NOT_FOUND
                        else Failure(error)
                    )
                ),
            )

        return (
            self._patient(lambda: self._send_held(safe=True))
            .bind(lambda _: self._patient(self._file.close))
            .bind(lambda _: self._patient(rename, after_failure=lambda: renamed.append(True)))
        )

    def _abort(self) -> Result[None, ProviderError]:
        self._file.drop()
        self._held.clear()

        def remove() -> Result[None, ProviderError]:
            return _in_session(
                self._location,
                lambda session: _nfs(
                    self._location, "abort", lambda: session.unlink(self._temporary)
                ).lash(
                    lambda error: (
                        Success(None)  # swept already
                        if error.kind is ErrorKind.NOT_FOUND
                        else Failure(error)
                    )
                ),
            )

        return self._aborts.abort_or_defer(
            f"the temporary of {self.url}", remove, store_gone=self._store_gone
        )

    def _send_held(self, *, safe: bool) -> Result[None, ProviderError]:
        """The held bytes not yet sent on this mount sent, and made safe if `safe`."""
        sent = self._file.use("write", self._sent_on)
        if not safe:
            return sent
        return sent.bind(
            lambda _: self._file.use("write", lambda session, handle: session.fsync(handle))
        ).map(lambda _: self._made_safe())

    def _made_safe(self) -> None:
        self._committed = self._sent
        self._held.clear()
        self._held_bytes = 0

    def _sent_on(self, session: NfsSession, handle: Handle) -> None:
        offset = self._committed
        for piece in self._held:
            end = offset + len(piece)
            if end > self._sent:
                skipped = self._sent - offset
                session.write_all(handle, self._sent, piece[skipped:] if skipped else piece)
                self._sent = end
            offset = end

    def _patient(
        self,
        step: Callable[[], Result[None, ProviderError]],
        after_failure: Callable[[], None] | None = None,
    ) -> Result[None, ProviderError]:
        """`step`, tried again within the budget; after a failure the mount is dropped and
        every held byte is sent again on the next."""

        def failed() -> None:
            self._file.drop()
            self._sent = self._committed
            if after_failure is not None:
                after_failure()

        tried = self._patience.retried(f"write {self.url}", step, after_failure=failed)
        match tried:
            case Failure(error) if error.kind is ErrorKind.UNAVAILABLE:
                self._store_gone = True
        return tried


def _path(key: str) -> str:
    """A path inside the mounted export, as libnfs wants it."""
    return f"/{key}"


def _mounted(location: StagedLocation) -> Result[NfsSession, ProviderError]:
    options = nfs_options(location)
    return _nfs(
        location,
        "reach",
        lambda: NfsSession(
            # The address the storage gate checked, when it did.
            location.address or options.server.strip("[]"),
            location.container,
            options.uid,
            options.gid,
        ),
        mounting=True,
    )


def _in_session(
    location: StagedLocation, work: Callable[[NfsSession], Result[T, ProviderError]]
) -> Result[T, ProviderError]:
    """`work` on a mount of its own, unmounted after."""

    def worked(session: NfsSession) -> Result[T, ProviderError]:
        try:
            return work(session)
        finally:
            session.close()

    return _mounted(location).bind(worked)


def _nfs(
    location: StagedLocation, action: str, call: Callable[[], T], mounting: bool = False
) -> Result[T, ProviderError]:
    """`call`, with libnfs's failures turned into this provider's kinds: the one place this
    module's exceptions become values."""
    try:
        return Success(call())
    except LibnfsMissingError as error:
        return Failure(ProviderError.unsupported(f"nfs staging: {error}"))
    except NfsError as error:
        return Failure(_refusal(location, action, error, mounting))


def _refusal(
    location: StagedLocation, action: str, error: NfsError, mounting: bool
) -> ProviderError:
    what = f"cannot {action} {location.url}"
    options = nfs_options(location)
    identity = f"uid {options.uid if options.uid is not None else os.getuid()}, gid " + str(
        options.gid if options.gid is not None else os.getgid()
    )
    if mounting and error.code in (errno.EACCES, errno.EPERM):
        return ProviderError.permission_denied(
            f"{what}: the server refused to mount {location.container!r} "
            f"(absent, or not exported to this client): {error}"
        )
    if mounting:
        return ProviderError.unavailable(
            f"{what}: NFS server {options.server!r} did not answer: {error}"
        )
    if error.code in (errno.EACCES, errno.EPERM):
        return ProviderError.permission_denied(f"{what}: the server refused {identity}: {error}")
    if error.code == errno.ENOENT:
        return ProviderError.not_found(f"{what}: no such file ({error})")
    if error.code in (errno.ENOSPC, errno.EDQUOT):
        return ProviderError.resource_exhausted(f"{what}: {error}")
    if error.code == errno.EEXIST:
        return ProviderError.failed_precondition(f"{what}: {error}")
    return ProviderError.unavailable(f"{what}: {error}")
