"""Scratch space for a conversion that needs a seekable file (qcow2 is written out of order)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, BinaryIO

from pyrigaud.adapters.disk_images.blocks import MAX_CHUNK_BYTES


@contextlib.contextmanager
def scratch_file(directory: str | None) -> Iterator[BinaryIO]:
    """An anonymous temporary file in `directory` (None: the system's temp dir), closed on
    exit. It is unlinked as it is made, so a provider killed mid-conversion leaves nothing."""
    with tempfile.TemporaryFile(dir=directory) as file:
        yield file


def spool(chunks: Iterable[bytes], file: IO[bytes]) -> None:
    """Every chunk written to `file` at its position."""
    for chunk in chunks:
        file.write(chunk)


def file_chunks(file: IO[bytes]) -> Iterator[bytes]:
    """The rest of `file` from its position, MAX_CHUNK_BYTES at a time."""
    while chunk := file.read(MAX_CHUNK_BYTES):
        yield chunk
