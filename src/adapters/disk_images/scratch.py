"""Scratch space for a conversion that needs a seekable file (qcow2 is written out of order)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, BinaryIO

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.blocks import MAX_CHUNK_BYTES, all_zero
from pyrigaud.application.ports.disk_transfer import TransferWatch
from pyrigaud.domain.chunks import Chunks
from pyrigaud.domain.errors import ProviderError


def open_scratch(directory: str | None) -> BinaryIO:
    """An anonymous temporary file in `directory` (None: the system's temp dir), the caller's
    to close. It is unlinked as it is made, so a provider killed mid-conversion leaves nothing."""
    return tempfile.TemporaryFile(dir=directory)


@contextlib.contextmanager
def scratch_file(directory: str | None) -> Iterator[BinaryIO]:
    """`open_scratch`, closed on exit."""
    with open_scratch(directory) as file:
        yield file


def given_or_scratch(
    given: BinaryIO | None, directory: str | None, files: contextlib.ExitStack
) -> BinaryIO:
    """`given`, or a new scratch file in `directory` that `files` closes."""
    return given if given is not None else files.enter_context(scratch_file(directory))


def spool(chunks: Iterable[bytes], file: IO[bytes]) -> None:
    """Every chunk written to `file` at its position."""
    for chunk in chunks:
        file.write(chunk)


def spool_sparse(chunks: Iterable[bytes], file: IO[bytes]) -> None:
    """Every chunk written to `file` from its start, all-zero chunks left as holes (a disk's
    free space costs no scratch room)."""
    size = 0
    for chunk in chunks:
        if all_zero(chunk):
            file.seek(len(chunk), 1)
        else:
            file.write(chunk)
        size += len(chunk)
    file.truncate(size)
    file.flush()


def file_chunks(file: IO[bytes]) -> Iterator[bytes]:
    """The rest of `file` from its position, MAX_CHUNK_BYTES at a time."""
    while chunk := file.read(MAX_CHUNK_BYTES):
        yield chunk


def counted(chunks: Iterable[bytes], watch: TransferWatch) -> Chunks[bytes]:
    """`chunks`, counted by `watch` as they pass; cut short once it says stop (its failure is
    their outcome: a conversion reads them deep inside)."""

    def each() -> Iterator[Result[bytes, ProviderError]]:
        for chunk in chunks:
            match watch.add(len(chunk)):
                case Failure(error):
                    yield Failure(error)
                    return
            yield Success(chunk)

    return Chunks(each(), after=chunks)
