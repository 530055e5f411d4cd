"""A qcow2 written to a seekable file in pure Python, chunk by chunk, from a raw disk: a
version 3 image with 64 KiB clusters whose refcounts are exact, so `qemu-img check` finds
neither errors nor leaks. (What pyrigaud reads of staged images, qemu-img reads.)"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import BinaryIO

from returns.result import Result

from pyrigaud.adapters.disk_images.blocks import (
    MAX_CHUNK_BYTES,
    SECTOR_BYTES,
    nonzero_blocks,
    round_up,
)
from pyrigaud.domain.errors import ProviderError

MAGIC = b"QFI\xfb"
# magic, version, backing_file_offset, backing_file_size, cluster_bits, size, crypt_method,
# l1_size, l1_table_offset, refcount_table_offset, refcount_table_clusters, nb_snapshots,
# snapshots_offset; then in version 3 the feature bits, refcount_order and header_length.
_V2_HEADER = struct.Struct(">4sIQIIQIIQQIIQ")
_V3_FIELDS = struct.Struct(">QQQII")
_V3_HEADER_BYTES = 112  # with the compression type byte, padded to 8 as QEMU writes it
_COPIED = 1 << 63  # the cluster's refcount is exactly one

CLUSTER_BITS = 16
CLUSTER_BYTES = 1 << CLUSTER_BITS
_L2_ENTRIES = CLUSTER_BYTES // 8
_REFCOUNT_ORDER = 4  # 16-bit refcounts, QEMU's default
_REFCOUNTS_PER_BLOCK = CLUSTER_BYTES * 8 >> _REFCOUNT_ORDER


def write_qcow2(
    raw_chunks: Iterable[bytes], capacity_bytes: int, file: BinaryIO
) -> Result[int, ProviderError]:
    """Write the raw disk (exactly `capacity_bytes`, any chunking) into the empty seekable
    `file` as a qcow2 v3 image with 64 KiB clusters; return the file's size (the raw disk's
    failure, or a wrong length, when the chunks end as they should not).

    Data clusters are written in order, each L2 table right after the data it maps (only one
    table is held), all-zero clusters stay unallocated; the L1 table, the refcounts and the
    header come last. Every cluster of the file is used exactly once, so each refcount is 1.
    """
    clusters = _Clusters(file, round_up(capacity_bytes, SECTOR_BYTES))
    blocks = nonzero_blocks(raw_chunks, capacity_bytes, CLUSTER_BYTES)
    return blocks.consumed_by(clusters.data_written).map(_Clusters.tables_written)


class _Clusters:
    """The image's clusters as they are written: the data, mapped by the L2 table being
    filled, then the tables once every data cluster is in."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self._file = file
        self._size = size
        span = _L2_ENTRIES * CLUSTER_BYTES
        self._l1_size = -(-size // span)
        l1_clusters = -(-self._l1_size * 8 // CLUSTER_BYTES)  # none for an empty disk: no leak
        self._l1 = [0] * self._l1_size  # 8 bytes per 512 MiB of disk
        self._next_cluster = 1 + l1_clusters
        self._l2: list[int] = []
        self._l2_index = 0

    def data_written(self, blocks: Iterable[tuple[int, bytes]]) -> _Clusters:
        """Every non-zero cluster written in order, each L2 table after the data it maps."""
        file = self._file
        file.seek(self._next_cluster * CLUSTER_BYTES)
        for cluster, data in blocks:
            if cluster // _L2_ENTRIES != self._l2_index:
                self._l1[self._l2_index] = _write_l2(file, self._l2, self._next_cluster)
                self._next_cluster += 1
                self._l2, self._l2_index = [], cluster // _L2_ENTRIES
            self._l2.extend([0] * (cluster % _L2_ENTRIES - len(self._l2)))
            self._l2.append(self._next_cluster * CLUSTER_BYTES | _COPIED)
            file.write(data)
            self._next_cluster += 1
        return self

    def tables_written(self) -> int:
        """The last L2 table, the refcounts, the L1 table and the header written; the file's
        size."""
        file = self._file
        if self._l2:
            self._l1[self._l2_index] = _write_l2(file, self._l2, self._next_cluster)
            self._next_cluster += 1
        table_offset, table_clusters, total = _write_refcounts(file, self._next_cluster)
        file.seek(CLUSTER_BYTES)
        for start in range(0, self._l1_size, MAX_CHUNK_BYTES // 8):
            piece = self._l1[start : start + MAX_CHUNK_BYTES // 8]
            file.write(struct.pack(f">{len(piece)}Q", *piece))
        file.seek(0)
        file.write(_header(self._size, self._l1_size, table_offset, table_clusters))
        file.truncate(total * CLUSTER_BYTES)
        file.flush()
        return total * CLUSTER_BYTES


def _write_l2(file: BinaryIO, entries: list[int], cluster: int) -> int:
    """Write an L2 table at `cluster` (the file's position); its L1 entry."""
    entries = entries + [0] * (_L2_ENTRIES - len(entries))
    file.write(struct.pack(f">{_L2_ENTRIES}Q", *entries))
    return cluster * CLUSTER_BYTES | _COPIED


def _write_refcounts(file: BinaryIO, first: int) -> tuple[int, int, int]:
    """Append the refcount table and blocks from cluster `first` (the file's position): every
    cluster in use, themselves included, gets refcount 1. (table offset, its clusters, total
    clusters of the file)."""
    blocks, table_clusters = 1, 1
    while True:
        total = first + table_clusters + blocks
        need_blocks = -(-total // _REFCOUNTS_PER_BLOCK)
        need_table = -(-need_blocks * 8 // CLUSTER_BYTES)
        if (need_blocks, need_table) == (blocks, table_clusters):
            break
        blocks, table_clusters = need_blocks, need_table
    table = struct.pack(
        f">{blocks}Q",
        *[(first + table_clusters + block) * CLUSTER_BYTES for block in range(blocks)],
    )
    file.write(table.ljust(table_clusters * CLUSTER_BYTES, b"\0"))
    full_block = struct.pack(">H", 1) * _REFCOUNTS_PER_BLOCK
    for block in range(blocks):
        used = min(total - block * _REFCOUNTS_PER_BLOCK, _REFCOUNTS_PER_BLOCK)
        file.write(full_block[: used * 2].ljust(CLUSTER_BYTES, b"\0"))
    return first * CLUSTER_BYTES, table_clusters, total


def _header(size: int, l1_size: int, refcount_offset: int, refcount_clusters: int) -> bytes:
    header = _V2_HEADER.pack(
        MAGIC,
        3,
        0,
        0,
        CLUSTER_BITS,
        size,
        0,
        l1_size,
        CLUSTER_BYTES if l1_size else 0,  # the L1 table follows the header cluster
        refcount_offset,
        refcount_clusters,
        0,
        0,
    ) + _V3_FIELDS.pack(0, 0, 0, _REFCOUNT_ORDER, _V3_HEADER_BYTES)
    # Compression type zlib (0) and padding, then the end of the header extensions.
    return header.ljust(_V3_HEADER_BYTES, b"\0") + bytes(8)
