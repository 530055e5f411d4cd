"""qcow2 read from and written to seekable files in pure Python, chunk by chunk.

Reading follows the active L1/L2 tables (versions 2 and 3, any cluster size, deflated
clusters, zero clusters); writing makes a version 3 image with 64 KiB clusters whose
refcounts are exact, so `qemu-img check` finds neither errors nor leaks.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from pyrigaud.adapters.disk_images.blocks import (
    MAX_CHUNK_BYTES,
    SECTOR_BYTES,
    ChunkReader,
    nonzero_blocks,
    round_up,
    zero_chunks,
)
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError

MAGIC = b"QFI\xfb"
# magic, version, backing_file_offset, backing_file_size, cluster_bits, size, crypt_method,
# l1_size, l1_table_offset, refcount_table_offset, refcount_table_clusters, nb_snapshots,
# snapshots_offset; then in version 3 the feature bits, refcount_order and header_length.
_V2_HEADER = struct.Struct(">4sIQIIQIIQQIIQ")
_V3_FIELDS = struct.Struct(">QQQII")
_V3_HEADER_BYTES = 112  # with the compression type byte, padded to 8 as QEMU writes it
INCOMPATIBLE_DIRTY = 1 << 0
INCOMPATIBLE_CORRUPT = 1 << 1
INCOMPATIBLE_DATA_FILE = 1 << 2
INCOMPATIBLE_COMPRESSION = 1 << 3
INCOMPATIBLE_EXTENDED_L2 = 1 << 4
_OFFSET_MASK = 0x00FF_FFFF_FFFF_FE00  # bits 9-55: a host offset in an L1 or L2 entry
_COPIED = 1 << 63  # the cluster's refcount is exactly one
_COMPRESSED = 1 << 62
_ZERO = 1 << 0
_LARGEST_L1_BYTES = 32 * 1024 * 1024  # QEMU's own limit
# An internal snapshot's entry: l1_table_offset, l1_size, id_str_size, name_size, date_sec,
# date_nsec, vm_clock_nsec, vm_state_size, extra_data_size; then extra data, id and name.
_SNAPSHOT_ENTRY = struct.Struct(">QIHHIIQII")
_MOST_SNAPSHOTS = 65536  # QEMU's own limit

CLUSTER_BITS = 16
CLUSTER_BYTES = 1 << CLUSTER_BITS
_L2_ENTRIES = CLUSTER_BYTES // 8
_REFCOUNT_ORDER = 4  # 16-bit refcounts, QEMU's default
_REFCOUNTS_PER_BLOCK = CLUSTER_BYTES * 8 >> _REFCOUNT_ORDER


def qcow2_virtual_size(header: bytes, *, field: str = fields.SOURCE_URL) -> int:
    """The disk's size in bytes, from a qcow2 image's first 32 bytes or more."""
    if len(header) < 32 or not header.startswith(MAGIC):
        raise _invalid(field, "not a qcow2 image")
    return int(struct.unpack_from(">Q", header, 24)[0])


def read_qcow2(
    file: BinaryIO,
    *,
    field: str = fields.SOURCE_URL,
    snapshot: str | None = None,
    backing: Iterable[bytes] | None = None,
) -> Iterator[bytes]:
    """The raw disk of a qcow2 file: exactly its virtual size, chunks <= 4 MiB.

    With `snapshot` (an internal snapshot's name or id) the disk as that snapshot holds it.
    With `backing` (the raw disk of its backing chain, read in step) the clusters this image
    leaves unallocated are the backing's; without it an image naming a backing file is refused.
    An image that keeps its data in an external file, is encrypted, uses extended L2 entries, a
    compression other than zlib or an incompatible feature this reader does not know is refused
    before a byte is yielded.
    """
    image = _Image.parse(file, field, allow_backing=backing is not None)
    l1_offset, l1_size = image.l1_table(snapshot) if snapshot else (image.l1_offset, None)
    out = _RunReader(file, None if backing is None else ChunkReader(backing))
    clusters_per_l2 = image.cluster_bytes // 8
    remaining = image.size
    for l1_entry in image.l1_entries(l1_offset, l1_size):
        span = min(remaining, clusters_per_l2 * image.cluster_bytes)
        remaining -= span
        l2_offset = l1_entry & _OFFSET_MASK
        if not l2_offset:
            yield from out.unallocated(span)
            continue
        l2 = struct.unpack(
            f">{clusters_per_l2}Q", _read_at(file, l2_offset, image.cluster_bytes, field)
        )
        for entry in l2[: -(-span // image.cluster_bytes)]:
            length = min(span, image.cluster_bytes)
            span -= length
            if entry & _COMPRESSED:
                yield from out.flush()
                out.pass_backing(length)
                yield image.inflated(entry, length)
            elif entry & _ZERO and image.version >= 3:
                yield from out.zeros(length)
            elif not entry & _OFFSET_MASK:
                yield from out.unallocated(length)
            else:
                yield from out.data(entry & _OFFSET_MASK, length)
    yield from out.flush()


def write_qcow2(raw_chunks: Iterable[bytes], capacity_bytes: int, file: BinaryIO) -> int:
    """Write the raw disk (exactly `capacity_bytes`, any chunking) into the empty seekable
    `file` as a qcow2 v3 image with 64 KiB clusters; return the file's size.

    Data clusters are written in order, each L2 table right after the data it maps (only one
    table is held), all-zero clusters stay unallocated; the L1 table, the refcounts and the
    header come last. Every cluster of the file is used exactly once, so each refcount is 1.
    """
    size = round_up(capacity_bytes, SECTOR_BYTES)
    span = _L2_ENTRIES * CLUSTER_BYTES
    l1_size = -(-size // span)
    l1_clusters = -(-l1_size * 8 // CLUSTER_BYTES)  # none for an empty disk: no leak
    l1 = [0] * l1_size  # 8 bytes per 512 MiB of disk
    next_cluster = 1 + l1_clusters
    file.seek(next_cluster * CLUSTER_BYTES)
    l2: list[int] = []
    l2_index = 0
    for cluster, data in nonzero_blocks(raw_chunks, capacity_bytes, CLUSTER_BYTES):
        if cluster // _L2_ENTRIES != l2_index:
            l1[l2_index] = _write_l2(file, l2, next_cluster)
            next_cluster += 1
            l2, l2_index = [], cluster // _L2_ENTRIES
        l2.extend([0] * (cluster % _L2_ENTRIES - len(l2)))
        l2.append(next_cluster * CLUSTER_BYTES | _COPIED)
        file.write(data)
        next_cluster += 1
    if l2:
        l1[l2_index] = _write_l2(file, l2, next_cluster)
        next_cluster += 1
    table_offset, table_clusters, total = _write_refcounts(file, next_cluster)
    file.seek(CLUSTER_BYTES)
    for start in range(0, l1_size, MAX_CHUNK_BYTES // 8):
        piece = l1[start : start + MAX_CHUNK_BYTES // 8]
        file.write(struct.pack(f">{len(piece)}Q", *piece))
    file.seek(0)
    file.write(_header(size, l1_size, table_offset, table_clusters))
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Image:
    """The facts of a qcow2 header this reader needs, checked."""

    file: BinaryIO
    field: str
    version: int
    cluster_bits: int
    size: int
    l1_offset: int
    snapshot_count: int = 0
    snapshots_offset: int = 0

    @property
    def cluster_bytes(self) -> int:
        return 1 << self.cluster_bits

    @classmethod
    def parse(cls, file: BinaryIO, field: str, *, allow_backing: bool = False) -> _Image:
        file.seek(0)
        header = file.read(_V3_HEADER_BYTES)
        if len(header) < _V2_HEADER.size or not header.startswith(MAGIC):
            raise _invalid(field, "not a qcow2 image")
        (_, version, backing, _, cluster_bits, size, crypt, l1_size, l1_offset, *rest) = (
            _V2_HEADER.unpack_from(header)
        )
        snapshot_count, snapshots_offset = rest[-2], rest[-1]
        if version not in (2, 3):
            raise _invalid(field, f"qcow2 version {version} is not supported (only 2 and 3)")
        if backing and not allow_backing:
            raise _invalid(field, "the qcow2 image names a backing file; give a standalone image")
        if crypt:
            raise _invalid(field, "the qcow2 image is encrypted; give an unencrypted image")
        if not 9 <= cluster_bits <= 21:
            raise _invalid(field, f"the qcow2 cluster size 2^{cluster_bits} is invalid")
        if version >= 3:
            _check_features(header, field)
        clusters_per_l2 = (1 << cluster_bits) // 8
        if l1_size * 8 > _LARGEST_L1_BYTES or l1_size * clusters_per_l2 << cluster_bits < size:
            raise _invalid(field, "the qcow2 L1 table does not fit the virtual size")
        return cls(
            file=file,
            field=field,
            version=version,
            cluster_bits=cluster_bits,
            size=size,
            l1_offset=l1_offset,
            snapshot_count=snapshot_count,
            snapshots_offset=snapshots_offset,
        )

    def l1_entries(self, offset: int, size: int | None) -> Iterator[int]:
        """The L1 entries at `offset` covering the virtual size, read a bounded piece at a
        time; past `size` entries (a snapshot's table, of a smaller disk) they are empty."""
        needed = -(-self.size // ((self.cluster_bytes // 8) * self.cluster_bytes))
        present = needed if size is None else min(needed, size)
        step = MAX_CHUNK_BYTES // 8
        for start in range(0, present, step):
            count = min(step, present - start)
            raw = _read_at(self.file, offset + start * 8, count * 8, self.field)
            yield from struct.unpack(f">{count}Q", raw)
        yield from [0] * (needed - present)

    def l1_table(self, snapshot: str) -> tuple[int, int]:
        """The (offset, entries) of the L1 table of the internal snapshot named or numbered
        `snapshot`; NOT_FOUND when the image has none such."""
        position = self.snapshots_offset
        for _ in range(min(self.snapshot_count, _MOST_SNAPSHOTS)):
            entry = _read_at(self.file, position, _SNAPSHOT_ENTRY.size, self.field)
            l1_offset, l1_size, id_size, name_size, *_, extra_size = _SNAPSHOT_ENTRY.unpack(entry)
            names_at = position + _SNAPSHOT_ENTRY.size + extra_size
            names = _read_at(self.file, names_at, id_size + name_size, self.field)
            if snapshot in (
                names[:id_size].decode(errors="replace"),
                names[id_size:].decode(errors="replace"),
            ):
                return l1_offset, l1_size
            position = names_at + id_size + name_size
            position += -position % 8
        raise ExpectedError(
            ProviderError.not_found(f"the qcow2 image has no internal snapshot {snapshot!r}")
        )

    def inflated(self, entry: int, length: int) -> bytes:
        """A compressed cluster's first `length` bytes (raw deflate, as QEMU writes it)."""
        shift = 62 - (self.cluster_bits - 8)
        offset = entry & ((1 << shift) - 1)
        sectors = (entry >> shift) & ((1 << (self.cluster_bits - 8)) - 1)
        stored = (sectors + 1) * SECTOR_BYTES - (offset & (SECTOR_BYTES - 1))
        self.file.seek(offset)
        compressed = self.file.read(stored)
        try:
            data = zlib.decompressobj(-15).decompress(compressed, self.cluster_bytes)
        except zlib.error as error:
            raise _invalid(
                self.field, f"a compressed qcow2 cluster does not inflate ({error})"
            ) from error
        if len(data) < length:
            raise _invalid(self.field, "a compressed qcow2 cluster inflates short of its size")
        return data[:length]


def _check_features(header: bytes, field: str) -> None:
    if len(header) < _V2_HEADER.size + _V3_FIELDS.size:
        raise _invalid(field, "the qcow2 header is shorter than version 3's")
    incompatible, _, _, _, header_length = _V3_FIELDS.unpack_from(header, _V2_HEADER.size)
    if incompatible & INCOMPATIBLE_DATA_FILE:
        raise _invalid(field, "the qcow2 image keeps its data in an external file")
    if incompatible & INCOMPATIBLE_EXTENDED_L2:
        raise _invalid(field, "the qcow2 image uses extended L2 entries (subclusters)")
    if incompatible & INCOMPATIBLE_CORRUPT:
        raise _invalid(field, "the qcow2 image is marked corrupt; repair it with qemu-img check")
    compression = header[104] if header_length > 104 and len(header) > 104 else 0
    if incompatible & INCOMPATIBLE_COMPRESSION or compression:
        raise _invalid(field, "the qcow2 image's clusters are compressed with zstd, not zlib")
    unknown = incompatible & ~(
        INCOMPATIBLE_DIRTY
        | INCOMPATIBLE_CORRUPT
        | INCOMPATIBLE_DATA_FILE
        | INCOMPATIBLE_COMPRESSION
        | INCOMPATIBLE_EXTENDED_L2
    )
    if unknown:
        raise _invalid(field, f"the qcow2 image needs unknown features (bits {unknown:#x})")


class _RunReader:
    """Gathers runs of zeros and of host-contiguous data clusters, and yields them in
    reads of at most 4 MiB."""

    def __init__(self, file: BinaryIO, backing: ChunkReader | None = None) -> None:
        self._file = file
        self._backing = backing
        self._zeros = 0
        self._start = 0
        self._length = 0

    def zeros(self, length: int) -> Iterator[bytes]:
        if self._length:
            yield from self.flush()
        self.pass_backing(length)
        self._zeros += length

    def unallocated(self, length: int) -> Iterator[bytes]:
        """Clusters this image does not hold: its backing's bytes, else zeros."""
        if self._backing is None:
            yield from self.zeros(length)
            return
        yield from self.flush()
        while length:
            step = min(length, MAX_CHUNK_BYTES)
            yield self._backing.read(step) or bytes(step)  # past the backing's end: zeros
            length -= step

    def pass_backing(self, length: int) -> None:
        """Keep the backing in step over clusters this image holds itself."""
        if self._backing is not None:
            self._backing.skip(length)

    def data(self, offset: int, length: int) -> Iterator[bytes]:
        if self._zeros or (self._length and offset != self._start + self._length):
            yield from self.flush()
        if not self._length:
            self._start = offset
        self.pass_backing(length)
        self._length += length
        if self._length >= MAX_CHUNK_BYTES:
            yield from self.flush()

    def flush(self) -> Iterator[bytes]:
        yield from zero_chunks(self._zeros)
        self._zeros = 0
        while self._length:
            step = min(self._length, MAX_CHUNK_BYTES)
            self._file.seek(self._start)
            data = self._file.read(step)
            if len(data) < step:
                data += bytes(step - len(data))  # a cluster past the end of file reads as zeros
            yield data
            self._start += step
            self._length -= step


def _read_at(file: BinaryIO, offset: int, length: int, field: str) -> bytes:
    file.seek(offset)
    data = file.read(length)
    if len(data) < length:
        raise _invalid(field, "the qcow2 image ends inside one of its tables")
    return data


def _invalid(field: str, problem: str) -> ExpectedError:
    return ExpectedError(ProviderError.invalid_spec(field, problem))
