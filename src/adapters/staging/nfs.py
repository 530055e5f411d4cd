"""Staged objects on an NFS export, through libnfs in this process: no kernel mount.

Provider pods have no privilege to mount (and these machines no NFS client in the kernel), so
the bytes travel over libnfs's userspace NFSv3 client as the URL's uid/gid (AUTH_SYS), as
qemu-img's `nfs://` driver would. The manager's names are flat (libnfs cannot make folders), so
a writer creates its marked temporary beside the final file, fsyncs it (an NFS COMMIT) and
renames it over the final name on the server (atomic there). A server that cannot be reached
or mounted is UNAVAILABLE; a refused uid/gid is PERMISSION_DENIED.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from returns.result import Result

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.libnfs import Handle, LibnfsMissingError, NfsError, NfsSession
from pyrigaud.adapters.staging.streams import CHUNK_BYTES, RunningDigest, TemporaryWriter, as_result
from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ErrorKind, ExpectedError, ProviderError
from pyrigaud.domain.staging import StagedDigest, StagedLocation
from pyrigaud.domain.staging_names import temporary_name, temporary_started_at

FILE_MODE = 0o640
T = TypeVar("T")


@dataclass(frozen=True)
class NfsStaging:
    """NFS staging; one libnfs mount per opened object, as the request's uid/gid."""

    owner: str = "pyrigaud"
    clock: Clock = field(default_factory=SystemClock)
    chunk_bytes: int = CHUNK_BYTES

    def open_read(self, location: StagedLocation) -> Result[NfsReader, ProviderError]:
        def opened() -> NfsReader:
            session = _mounted(location)
            try:
                handle = _nfs(location, "read", lambda: session.open(_path(location.key), 0))
                return NfsReader(session, handle, location, self.chunk_bytes)
            except BaseException:
                session.close()
                raise

        return as_result(opened)

    def open_write(
        self, location: StagedLocation, size_bytes: int | None = None
    ) -> Result[NfsWriter, ProviderError]:
        del size_bytes  # a file needs no plan
        started = self.clock.now()

        def opened() -> NfsWriter:
            name = temporary_name(location.name, self.owner, started, secrets.token_hex(4))
            temporary = _path(f"{location.parent}/{name}" if location.parent else name)
            session = _mounted(location)
            try:
                handle = _nfs(location, "write", lambda: session.create_new(temporary, FILE_MODE))
                return NfsWriter(session, handle, temporary, location)
            except BaseException:
                session.close()
                raise

        return as_result(opened)

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        """This provider's abandoned temporaries in the location's folder on the export."""

        def swept() -> int:
            deadline = self.clock.now() - older_than_seconds
            with _session(location) as session:
                folder = _path(location.parent)
                names = _nfs(location, "sweep", lambda: list(session.names(folder)))
                removed = 0
                for name in names:
                    started = temporary_started_at(name, self.owner)
                    if started is None or started > deadline:
                        continue
                    path = f"{folder.rstrip('/')}/{name}"
                    try:
                        _nfs(location, "sweep", functools.partial(session.unlink, path))
                        removed += 1
                    except ExpectedError as error:
                        if error.error.kind is not ErrorKind.NOT_FOUND:  # else: another's sweep
                            raise
                return removed

        return as_result(swept)


class NfsReader:
    def __init__(
        self, session: NfsSession, handle: Handle, location: StagedLocation, chunk_bytes: int
    ) -> None:
        self._session = session
        self._handle: Handle | None = handle
        self._location = location
        self._buffer = ctypes.create_string_buffer(chunk_bytes)
        self._offset = 0
        self._digest = RunningDigest()
        self.size_bytes: int | None = _nfs(location, "read", lambda: session.size(handle))

    def read_chunk(self) -> Result[bytes, ProviderError]:
        def read() -> bytes:
            handle = self._handle
            if handle is None:
                raise ExpectedError(ProviderError.internal(f"{self._location.url} is closed"))
            count = _nfs(
                self._location,
                "read",
                lambda: self._session.read_into(handle, self._offset, self._buffer),
            )
            chunk = ctypes.string_at(self._buffer, count)
            self._offset += count
            self._digest.add(chunk)
            return chunk

        return as_result(read)

    def digest(self) -> StagedDigest:
        return self._digest.value()

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                self._session.close_file(handle)
            except NfsError:
                pass  # read-only: nothing to lose
            finally:
                self._session.close()


class NfsWriter(TemporaryWriter):
    def __init__(
        self, session: NfsSession, handle: Handle, temporary: str, location: StagedLocation
    ) -> None:
        super().__init__(location.url)
        self._session = session
        self._handle: Handle | None = handle
        self._temporary = temporary
        self._location = location
        self._offset = 0

    def _write(self, chunk: bytes) -> None:
        handle = self._open_handle()
        _nfs(self._location, "write", lambda: self._session.write_all(handle, self._offset, chunk))
        self._offset += len(chunk)

    def _commit(self) -> None:
        handle = self._open_handle()
        _nfs(self._location, "write", lambda: self._session.fsync(handle))
        self._handle = None
        _nfs(self._location, "write", lambda: self._session.close_file(handle))
        final = _path(self._location.key)
        _nfs(self._location, "write", lambda: self._session.rename(self._temporary, final))
        self._session.close()

    def _abort(self) -> None:
        try:
            if self._handle is not None:
                handle, self._handle = self._handle, None
                with contextlib.suppress(NfsError):  # the file goes anyway
                    self._session.close_file(handle)
            try:
                _nfs(self._location, "abort", lambda: self._session.unlink(self._temporary))
            except ExpectedError as error:
                if error.error.kind is not ErrorKind.NOT_FOUND:  # else: swept already
                    raise
        finally:
            self._session.close()

    def _open_handle(self) -> Handle:
        if self._handle is None:
            raise ExpectedError(ProviderError.internal(f"{self.url} is closed"))
        return self._handle


def _path(key: str) -> str:
    """A path inside the mounted export, as libnfs wants it."""
    return f"/{key}"


def _mounted(location: StagedLocation) -> NfsSession:
    options = location.options
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


@contextmanager
def _session(location: StagedLocation) -> Iterator[NfsSession]:
    session = _mounted(location)
    try:
        yield session
    finally:
        session.close()


def _nfs(location: StagedLocation, action: str, call: Callable[[], T], mounting: bool = False) -> T:
    """`call`, with libnfs's failures turned into this provider's kinds."""
    try:
        return call()
    except LibnfsMissingError as error:
        raise ExpectedError(ProviderError.unsupported(f"nfs staging: {error}")) from None
    except NfsError as error:
        raise ExpectedError(_refusal(location, action, error, mounting)) from None


def _refusal(
    location: StagedLocation, action: str, error: NfsError, mounting: bool
) -> ProviderError:
    what = f"cannot {action} {location.url}"
    options = location.options
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
