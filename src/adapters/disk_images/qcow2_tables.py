"""The tables of a qcow2 kept as a disk as it is, checked where qemu would refuse them.

qemu checks where a qcow2's L1 and refcount tables start when it opens the image (the judge
does the same from the header, `inspection.py`). The entries of those tables it checks only
when it goes through them: an L2 table or a refcount block that does not start on a cluster,
or a data cluster an L2 entry places off a cluster boundary, makes it mark the image corrupt
and fail the guest's read. A conversion by qemu-img reads every table, so it refuses such an
image; an image kept as it is gets the same checks here, before it is answered as a disk.

`read(offset, length)` gives the image's bytes (fewer at its end: qemu reads zeros past it),
so what is checked is what landed. One table is held at a time, at most qemu's own bounds:
an L1 table of 32 MiB, a refcount table of 8 MiB, an L2 table of one cluster.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

# The header from its cluster_bits (qemu's docs/interop/qcow2.txt): cluster_bits, size,
# (crypt_method), l1_size, l1_table_offset, refcount_table_offset, refcount_table_clusters.
_TABLES = struct.Struct(">IQ4xIQQI")
_TABLES_AT = 20
_ENTRY = struct.Struct(">Q")
OFFSET_MASK = 0x00FFFFFFFFFFFE00  # an L1 or L2 entry's offset bits
REFCOUNT_OFFSET_MASK = 0xFFFFFFFFFFFFFE00  # a refcount table entry's
COMPRESSED = 1 << 62  # an L2 entry of a compressed cluster: its offset is a byte offset
MAX_L1_BYTES = 32 * 1024 * 1024  # qemu's QCOW_MAX_L1_SIZE
MAX_REFCOUNT_TABLE_BYTES = 8 * 1024 * 1024  # qemu's QCOW_MAX_REFTABLE_SIZE
PIECE_BYTES = 1024 * 1024  # how much of a long table is read at once

Reader = Callable[[int, int], bytes]


def qcow2_tables_problem(read: Reader) -> str | None:
    """What qemu would refuse as corrupt in the tables of the plain qcow2 `read` gives (a
    version 2 or 3 image without extended L2 entries, as the judge passed it), or None."""
    cluster_bits, _size, l1_entries, l1_offset, refcount_offset, refcount_clusters = _TABLES.unpack(
        _padded(read, _TABLES_AT, _TABLES.size)
    )
    cluster = 1 << cluster_bits
    if l1_entries * _ENTRY.size > MAX_L1_BYTES:
        return "the qcow2 image's L1 table is larger than qemu reads (32 MiB)"
    refcount_bytes = refcount_clusters * cluster
    if refcount_bytes > MAX_REFCOUNT_TABLE_BYTES:
        return "the qcow2 image's refcount table is larger than qemu reads (8 MiB)"
    for index, entry in _entries(read, refcount_offset, refcount_bytes):
        if (entry & REFCOUNT_OFFSET_MASK) % cluster:
            return (
                f"the qcow2 image's refcount block {index} does not start on a cluster "
                "(qemu refuses the image as corrupt)"
            )
    for index, entry in _entries(read, l1_offset, l1_entries * _ENTRY.size):
        table = entry & OFFSET_MASK
        if not table:
            continue
        if table % cluster:
            return (
                f"the qcow2 image's L2 table {index} does not start on a cluster "
                "(qemu refuses the image as corrupt)"
            )
        if _misplaced_cluster(_padded(read, table, cluster), cluster):
            return (
                f"the qcow2 image's L2 table {index} places a data cluster off a cluster "
                "boundary (qemu refuses the image as corrupt)"
            )
    return None


def _misplaced_cluster(table: bytes, cluster: int) -> bool:
    """Whether an L2 table maps a (not compressed) data cluster to an unaligned offset."""
    return any(
        not entry & COMPRESSED and (entry & OFFSET_MASK) % cluster
        for (entry,) in _ENTRY.iter_unpack(table)
    )


def _entries(read: Reader, offset: int, length: int) -> Iterator[tuple[int, int]]:
    """The 8-byte entries of the table at `offset`, numbered, read a piece at a time."""
    index = 0
    for start in range(0, length, PIECE_BYTES):
        piece = _padded(read, offset + start, min(PIECE_BYTES, length - start))
        for (entry,) in _ENTRY.iter_unpack(piece):
            yield index, entry
            index += 1


def _padded(read: Reader, offset: int, length: int) -> bytes:
    """`length` bytes at `offset`, zeros past the image's end (as qemu reads them)."""
    data = read(offset, length)
    return data + bytes(length - len(data)) if len(data) < length else data
