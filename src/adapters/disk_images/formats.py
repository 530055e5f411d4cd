"""A downloaded qcow2's header checked before any of it is stored (ImagePrepare and Create
from a URL): an image that would make a reader open another file of the host (a backing file,
an external data file) is refused, as that file's content would become the disk's. Staged
disks are judged whole by `inspection.py`."""

from __future__ import annotations

import struct

QCOW2_MAGIC = b"QFI\xfb"
# A qcow2 header: magic, version, backing file offset ... (72 bytes), then in version 3 the
# incompatible feature bits, of which bit 2 says the data lives in an external file.
QCOW2_HEADER_BYTES = 80
QCOW2_EXTERNAL_DATA_FILE = 1 << 2


def qcow2_refusal(header: bytes) -> str | None:
    """Why a qcow2 header may not be used (it names another file), or None."""
    if len(header) < QCOW2_HEADER_BYTES:
        return "the qcow2 image is shorter than its own header"
    version, backing_offset = struct.unpack_from(">IQ", header, 4)
    if backing_offset:
        return "the qcow2 image names a backing file; give a standalone image"
    (incompatible,) = struct.unpack_from(">Q", header, 72)
    if version >= 3 and incompatible & QCOW2_EXTERNAL_DATA_FILE:
        return "the qcow2 image keeps its data in an external file"
    return None
