"""Scratch space for a conversion that needs a seekable file (qcow2 is written out of order)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import BinaryIO


@contextlib.contextmanager
def scratch_file(directory: str | None) -> Iterator[BinaryIO]:
    """An anonymous temporary file in `directory` (None: the system's temp dir), closed on
    exit. It is unlinked as it is made, so a provider killed mid-conversion leaves nothing."""
    with tempfile.TemporaryFile(dir=directory) as file:
        yield file
