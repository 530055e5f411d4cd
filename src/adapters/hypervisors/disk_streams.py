"""The DiskStream a hypervisor adapter hands ExportDisk: its chunks read under the adapter's own
edge (exceptions become values there) as Results, a stream's failure as the read it ended with,
or its image made whole first by the adapter's `Make`, and what the read holds released when
it is closed."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.scratch import file_chunks
from pyrigaud.domain.chunks import results_of
from pyrigaud.domain.disk_images import LeftBehind
from pyrigaud.domain.errors import ProviderError

logger = logging.getLogger(__name__)

# A read (the next chunk, b"" at the end, or the stream's failure) made at the adapter's edge.
Edge = Callable[[Callable[[], Result[bytes, ProviderError]]], Result[bytes, ProviderError]]
# An image made whole in a file before it can be read, at the adapter's edge: in the file
# given, or in a new scratch file the adapter's holds keep when given None; the file it is in.
Make = Callable[[BinaryIO | None], Result[BinaryIO, ProviderError]]


class TransferStoppedError(Exception):
    """What a hold sees when the transfer stopped before the last chunk (an export lease is
    then aborted rather than completed)."""


class ChunkStream:
    """`chunks` of `size_bytes` (None: not told beforehand), each read through `edge`, or the
    image `chunks` makes whole first; `holds` (temporary copies, a lease) are released on
    close, as after a failure unless every chunk was read (or the image made in place)."""

    def __init__(
        self,
        chunks: Iterator[bytes] | Make,
        size_bytes: int | None,
        holds: contextlib.ExitStack,
        edge: Edge,
        left_behind: tuple[LeftBehind, ...] = (),
    ) -> None:
        self._make = None if isinstance(chunks, Iterator) else chunks
        self._made_whole_first = self._make is not None
        self._chunks: Iterator[bytes] = chunks if isinstance(chunks, Iterator) else iter(())
        self._reads = results_of(self._chunks)
        self._left_behind = left_behind
        self._size_bytes = size_bytes
        self._holds = holds
        self._edge = edge
        self._finished = False

    @property
    def size_bytes(self) -> int | None:
        return self._size_bytes

    @property
    def left_behind(self) -> tuple[LeftBehind, ...]:
        return self._left_behind

    @property
    def made_whole_first(self) -> bool:
        return self._made_whole_first

    def make(self, into: BinaryIO | None) -> Result[None, ProviderError]:
        if self._make is None:
            return Success(None)
        match self._make(into):
            case Failure() as failed:
                return failed
            case Success(file):
                pass
        self._make = None  # made: once
        if into is not None:
            self._finished = True  # nothing is left to read
            return Success(None)
        self._size_bytes = os.fstat(file.fileno()).st_size
        file.seek(0)
        self._chunks = file_chunks(file)
        self._reads = results_of(self._chunks)
        return Success(None)

    def read_chunk(self) -> Result[bytes, ProviderError]:
        if self._make is not None:
            match self.make(None):
                case Failure() as failed:
                    return failed
        read = self._edge(self._next)
        if read == _END:  # not cut short: a codec's chunks end early with their failure
            self._finished = True
        return read

    def close(self) -> None:
        """Release what the read holds; a failure to is logged (the transfer's answer stands)."""
        match self._edge(self._release):
            case Failure(error):
                logger.warning("could not release what a disk export held: %s", error)

    def _release(self) -> Result[bytes, ProviderError]:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()  # a generator's own cleanup (an open libvirt stream is aborted)
        if self._finished:
            self._holds.close()
        else:
            stopped = TransferStoppedError("the transfer stopped before the disk's end")
            self._holds.__exit__(TransferStoppedError, stopped, None)
        return _END

    def _next(self) -> Result[bytes, ProviderError]:
        return next(self._reads, _END)


_END: Result[bytes, ProviderError] = Success(b"")
