"""A downloaded image's format, judged from its first bytes before any of it is stored.

The download itself is the shared `pyrigaud.adapters.downloads`.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator

QCOW2_MAGIC = b"QFI\xfb"
# A qcow2 header: magic, version, backing file offset ... (72 bytes), then in version 3 the
# incompatible feature bits, of which bit 2 says the data lives in an external file.
HEADER_BYTES = 80
QCOW2_EXTERNAL_DATA_FILE = 1 << 2


class UnusableImageError(Exception):
    """The image may not become a VM's disk (it would make QEMU open other files of the host)."""


def peek_header(chunks: Iterator[bytes]) -> tuple[bytes, Iterator[bytes]]:
    """The image's first HEADER_BYTES (all of a shorter one) and the whole body, still to read."""
    taken: list[bytes] = []
    size = 0
    while size < HEADER_BYTES and (chunk := next(chunks, b"")):
        taken.append(chunk)
        size += len(chunk)
    return b"".join(taken)[:HEADER_BYTES], itertools.chain(taken, chunks)


def image_format_of(header: bytes) -> str:
    """The image's format, qcow2 or raw, judged by its magic number before a byte is stored.

    A qcow2 image naming a backing file or an external data file is refused: QEMU (or the
    conversion) would open that path on the host and give its content to the guest.
    """
    if not header:
        raise UnusableImageError("the server sent an empty image")
    if not header.startswith(QCOW2_MAGIC):
        return "raw"
    if len(header) < HEADER_BYTES:
        raise UnusableImageError("the qcow2 image is shorter than its own header")
    version, backing_offset = struct.unpack_from(">IQ", header, 4)
    if backing_offset:
        raise UnusableImageError("the qcow2 image names a backing file; give a standalone image")
    (incompatible,) = struct.unpack_from(">Q", header, 72)
    if version >= 3 and incompatible & QCOW2_EXTERNAL_DATA_FILE:
        raise UnusableImageError("the qcow2 image keeps its data in an external file")
    return "qcow2"
