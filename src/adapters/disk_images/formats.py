"""A disk image's format judged from its first bytes, before any of it is stored or converted.

An image that would make a reader open another file of the host (a qcow2 backing file or
external data file, a VMDK descriptor naming extents) is refused: that file's content would
become the disk's.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Iterator

from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError

QCOW2_MAGIC = b"QFI\xfb"
VMDK_SPARSE_MAGIC = b"KDMV"
VMDK_DESCRIPTOR = b"# Disk DescriptorFile"
# A qcow2 header: magic, version, backing file offset ... (72 bytes), then in version 3 the
# incompatible feature bits, of which bit 2 says the data lives in an external file.
HEADER_BYTES = 80
QCOW2_EXTERNAL_DATA_FILE = 1 << 2


def disk_format_of(header: bytes, *, field: str = fields.SOURCE_URL) -> str:
    """ "qcow2", "vmdk" (a self-contained sparse extent) or "raw", from the image's first bytes
    (HEADER_BYTES of them, or all of a shorter image)."""
    problem = _refusal(header)
    if problem:
        raise ExpectedError(ProviderError.invalid_spec(field, problem))
    if header.startswith(VMDK_SPARSE_MAGIC):
        return "vmdk"
    return "qcow2" if header.startswith(QCOW2_MAGIC) else "raw"


def qcow2_refusal(header: bytes) -> str | None:
    """Why a qcow2 header may not be used (it names another file), or None."""
    if len(header) < HEADER_BYTES:
        return "the qcow2 image is shorter than its own header"
    version, backing_offset = struct.unpack_from(">IQ", header, 4)
    if backing_offset:
        return "the qcow2 image names a backing file; give a standalone image"
    (incompatible,) = struct.unpack_from(">Q", header, 72)
    if version >= 3 and incompatible & QCOW2_EXTERNAL_DATA_FILE:
        return "the qcow2 image keeps its data in an external file"
    return None


def _refusal(header: bytes) -> str | None:
    if not header:
        return "the server sent an empty image"
    if header.startswith(VMDK_SPARSE_MAGIC):
        # A sparse extent of capacity 0 is a descriptor in disguise: its extents are files.
        if len(header) < 20 or struct.unpack_from("<Q", header, 12)[0] == 0:
            return "the vmdk image names other extent files; give a monolithic one"
        return None
    if header.startswith(VMDK_DESCRIPTOR):
        return "a vmdk descriptor names other extent files; give a monolithic one"
    if header.startswith(QCOW2_MAGIC):
        return qcow2_refusal(header)
    return None


def peek_header(
    chunks: Iterable[bytes], count: int = HEADER_BYTES
) -> tuple[bytes, Iterator[bytes]]:
    """The image's first `count` bytes (all of a shorter one) and the whole image, still to
    read: its format is judged before a byte is stored."""
    stream = iter(chunks)
    taken: list[bytes] = []
    size = 0
    while size < count and (chunk := next(stream, b"")):
        taken.append(chunk)
        size += len(chunk)
    return b"".join(taken)[:count], itertools.chain(taken, stream)
