"""An NFS file being read or written through a mount of its own, mounted again after the
server stopped answering (`nfs.py` says how a transfer waits a server out).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.libnfs import Handle, NfsSession
from pyrigaud.adapters.staging.nfs_calls import in_session, mounted, nfs_call, nfs_path
from pyrigaud.adapters.staging.patience import Patience
from pyrigaud.adapters.staging.streams import RunningDigest, TemporaryWriter
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.staging import StagedDigest, StagedLocation

HELD_BYTES = 16 * 1024 * 1024  # written but not yet COMMITted: resent after a reconnection
T = TypeVar("T")


def first_use(
    file: OpenFile, patience: Patience, doing: str, action: str, after_failure: Callable[[], None]
) -> Result[None, ProviderError]:
    """The file mounted and opened (tried again within the budget); dropped when it is not."""
    try:
        used = patience.retried(
            doing,
            partial(file.use, action, _nothing_more),
            after_failure=after_failure,
        )
    except BaseException:
        file.drop()
        raise
    match used:
        case Failure(_):
            file.drop()
    return used


def _nothing_more(session: NfsSession, handle: Handle) -> None:
    """A use that only mounts and opens the file."""
    del session, handle


class OpenFile:
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
        def called(opened: tuple[NfsSession, Handle]) -> Result[T, ProviderError]:
            return nfs_call(self._location, action, partial(call, *opened))

        return self._opened().bind(called)

    def _opened(self) -> Result[tuple[NfsSession, Handle], ProviderError]:
        if self._open is not None:
            return Success(self._open)
        return mounted(self._location).bind(self._opened_on)

    def _opened_on(self, session: NfsSession) -> Result[tuple[NfsSession, Handle], ProviderError]:
        try:
            opened = self._opening(session, self._path)
        except BaseException:
            session.close()
            raise
        match opened:
            case Failure() as failed:
                session.close()
                return failed
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
            return nfs_call(self._location, "write", partial(session.close_file, handle))
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
        file: OpenFile,
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
            raise RuntimeError(f"read of {self._location.url} after it was closed")
        return self._patience.retried(
            f"read {self._location.url} from byte {self._offset}",
            partial(self._file.use, "read", self._read_at_offset),
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
        file: OpenFile,
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
        return self._patient(partial(self._send_held, safe=self._held_bytes >= HELD_BYTES))

    def _commit(self) -> Result[None, ProviderError]:
        final = nfs_path(self._location.key)
        renamed: list[bool] = []

        def renamed_before(error: ProviderError) -> Result[None, ProviderError]:
            """A rename tried again after its answer was lost finds no temporary: done."""
            if renamed and error.kind is ErrorKind.NOT_FOUND:
                return Success(None)
            return Failure(error)

        def rename_on(session: NfsSession) -> Result[None, ProviderError]:
            return nfs_call(
                self._location, "write", partial(session.rename, self._temporary, final)
            ).lash(renamed_before)

        return Result.do(
            None
            for _ in self._patient(partial(self._send_held, safe=True))
            for _ in self._patient(self._file.close)
            for _ in self._patient(
                partial(in_session, self._location, rename_on),
                after_failure=partial(renamed.append, True),
            )
        )

    def _abort(self) -> Result[None, ProviderError]:
        self._file.drop()
        self._held.clear()

        def unlink_on(session: NfsSession) -> Result[None, ProviderError]:
            return nfs_call(self._location, "abort", partial(session.unlink, self._temporary)).lash(
                _swept_already
            )

        return self._aborts.abort_or_defer(
            f"the temporary of {self.url}",
            partial(in_session, self._location, unlink_on),
            store_gone=self._store_gone,
        )

    def _send_held(self, *, safe: bool) -> Result[None, ProviderError]:
        """The held bytes not yet sent on this mount sent, and made safe if `safe`."""
        sent = self._file.use("write", self._sent_on)
        if not safe:
            return sent
        synced = Result.do(None for _ in sent for _ in self._file.use("write", NfsSession.fsync))
        return synced.map(self._made_safe)

    def _made_safe(self, _synced: None) -> None:
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


def _swept_already(error: ProviderError) -> Result[None, ProviderError]:
    """An abort that finds no temporary: the sweep removed it."""
    return Success(None) if error.kind is ErrorKind.NOT_FOUND else Failure(error)
