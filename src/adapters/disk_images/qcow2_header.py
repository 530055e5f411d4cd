"""What qemu checks of a qcow2's header when it opens the image, and refuses the image for: the
same rules, made by the judge on the header's bytes before a byte is kept as a disk.

The rules are qemu's `qcow2_do_open` and `qcow2_read_extensions` (block/qcow2.c), each seen to
refuse (or to accept) with qemu-img 7.2 on images bent one field at a time
(tests/unit/disk_images/test_qcow2_header.py): the version, the cluster size, the header's
length against its version and its cluster, the refcount width, the compression type and its
feature bit, the sizes and offsets of the L1, refcount and snapshot tables, the subcluster
size of extended L2 entries, and the header extensions' lengths. What qemu reads but pyrigaud
does not take (a backing file, encryption, an external data file, the corrupt bit, unknown
incompatible features) is refused as well, by name.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from pyrigaud.adapters.disk_images.qcow2_tables import (
    MAX_CLUSTER_BITS,
    MAX_REFCOUNT_ORDER,
    MAX_REFCOUNT_TABLE_BYTES,
    MIN_CLUSTER_BITS,
    QCOW2_CORRUPT,
    QCOW2_EXTENDED_L2,
    QCOW2_FEATURES_OFFSET,
    QCOW2_KNOWN_FEATURES,
)

# qcow2's header (qemu's docs/interop/qcow2.txt): magic, version, backing file offset and
# size, cluster bits, size, crypt method, L1 entries and offset, refcount table offset and
# clusters, snapshot count and offset.
_HEADER = struct.Struct(">4sIQIIQIIQQIIQ")
# Version 3 goes on: incompatible, compatible and autoclear features, refcount order, header
# length; then, when the header is long enough, the compression type byte.
_V3_FIELDS = struct.Struct(">QQQII")
V2_HEADER_BYTES = _HEADER.size  # 72
V3_MIN_HEADER_BYTES = V2_HEADER_BYTES + _V3_FIELDS.size  # 104
_COMPRESSION_TYPE_OFFSET = V3_MIN_HEADER_BYTES
QCOW2_COMPRESSION_TYPE = 1 << 3  # the incompatible feature bit: not zlib
QCOW2_DATA_FILE_RAW = 1 << 1  # the autoclear feature bit: the external data file is raw
ZLIB, ZSTD = 0, 1
MIN_EXTENDED_L2_CLUSTER_BITS = 14  # 32 subclusters of at least 512 bytes
MAX_L1_ENTRIES = 32 * 1024 * 1024 // 8  # qemu's QCOW_MAX_L1_SIZE, of 8-byte entries
MAX_SNAPSHOTS = 65536  # qemu's QCOW_MAX_SNAPSHOTS
SNAPSHOT_HEADER_BYTES = 40
_INT64_MAX = (1 << 63) - 1
# Header extensions: (type, length) then the data padded to 8 bytes, until type 0.
_EXTENSION = struct.Struct(">II")
_EXTENSION_END = 0
_BACKING_FORMAT = 0xE2792ACA
_CRYPTO_HEADER = 0x0537BE77
_BITMAPS = 0x23852875
_MAX_BACKING_FORMAT_BYTES = 16  # qemu's sizeof(bs->backing_format), its terminator included
_BITMAPS_EXTENSION_BYTES = 24
_LUKS = 2  # the crypt method


@dataclass(frozen=True)
class _Header:
    """The fields qemu checks at open (a version 2 header's version 3 fields are fixed)."""

    version: int
    backing_offset: int
    backing_bytes: int
    cluster_bits: int
    size: int
    crypt_method: int
    l1_entries: int
    l1_offset: int
    refcount_offset: int
    refcount_clusters: int
    snapshots: int
    snapshots_offset: int
    features: int = 0
    autoclear: int = 0
    header_bytes: int = V2_HEADER_BYTES
    refcount_order: int = 4
    compression: int = ZLIB

    @classmethod
    def read(cls, head: bytes) -> _Header:
        _magic, *fields = _HEADER.unpack_from(head)
        header = cls(*fields)
        if header.version != 3:
            return header
        features, _compatible, autoclear, refcount_order, header_bytes = _V3_FIELDS.unpack_from(
            head, QCOW2_FEATURES_OFFSET
        )
        compression = (
            head[_COMPRESSION_TYPE_OFFSET] if header_bytes > _COMPRESSION_TYPE_OFFSET else ZLIB
        )
        return replace(
            header,
            features=features,
            autoclear=autoclear,
            header_bytes=header_bytes,
            refcount_order=refcount_order,
            compression=compression,
        )


def qcow2_header_problem(head: bytes, whole: bool) -> str | None:
    """What qemu refuses at open in the qcow2 whose first bytes are `head` (`whole`: all of
    them), or None, in qemu's order. The cluster size comes first: a header's cluster bits are
    never used as a shift before they are checked."""
    header = _Header.read(head)
    if header.version not in (2, 3):
        return f"the image is a qcow version {header.version} image: only 2 and 3 are read here"
    if not MIN_CLUSTER_BITS <= header.cluster_bits <= MAX_CLUSTER_BITS:
        return (
            f"the qcow2 image's clusters are 2^{header.cluster_bits} bytes; qemu reads 512 B "
            "to 2 MiB (2^9 to 2^21)"
        )
    cluster = 1 << header.cluster_bits
    extensions_end = header.backing_offset or cluster
    return (
        _length_problem(header)
        or _features_problem(header)
        or _compression_problem(header.compression, header.features)
        or _extensions_problem(head, whole, header.header_bytes, extensions_end, header)
        or _tables_problem(header)
    )


def _length_problem(header: _Header) -> str | None:
    cluster = 1 << header.cluster_bits
    if header.version == 3 and header.header_bytes < V3_MIN_HEADER_BYTES:
        return f"the qcow2 header is {header.header_bytes} bytes, shorter than qemu reads (104)"
    if header.header_bytes > cluster:
        return (
            f"the qcow2 header is {header.header_bytes} bytes, more than its cluster (qemu "
            "refuses it)"
        )
    return None


def _features_problem(header: _Header) -> str | None:
    """What qemu refuses, or pyrigaud does not take, in the features the header names."""
    if header.crypt_method:
        return "the qcow2 image is encrypted: decrypt it first (pyrigaud holds no keys)"
    if header.features & QCOW2_CORRUPT:
        return "the qcow2 image is marked corrupt (qemu-img check -r all repairs it)"
    if header.autoclear & QCOW2_DATA_FILE_RAW:  # pyrigaud takes no external data file
        return "the qcow2 image's data is raw in an external data file (qemu refuses it alone)"
    if header.features & ~QCOW2_KNOWN_FEATURES:
        return "the qcow2 image needs features qemu does not know"
    if header.refcount_order > MAX_REFCOUNT_ORDER:
        return (
            f"the qcow2 image's refcounts are 2^{header.refcount_order} bits wide; qemu reads "
            "64 at most"
        )
    if header.features & QCOW2_EXTENDED_L2 and header.cluster_bits < MIN_EXTENDED_L2_CLUSTER_BITS:
        return (
            "the qcow2 image's extended L2 entries make subclusters under 512 bytes "
            "(clusters under 16 KiB; qemu refuses it)"
        )
    return None


def _compression_problem(compression: int, features: int) -> str | None:
    """zlib, or zstd named by the feature bit, as qemu's validate_compression_type wants."""
    if compression not in (ZLIB, ZSTD):
        return (
            f"the qcow2 image's compression type {compression} is unknown (qemu knows zlib "
            "and zstd)"
        )
    if compression == ZLIB and features & QCOW2_COMPRESSION_TYPE:
        return "the qcow2 image's compression type is zlib but its feature bit says otherwise"
    if compression != ZLIB and not features & QCOW2_COMPRESSION_TYPE:
        return "the qcow2 image's compression type is not zlib but its feature bit is not set"
    return None


def _extensions_problem(
    head: bytes, whole: bool, start: int, end: int, header: _Header
) -> str | None:
    """qemu's reading of the header extensions, from the header's end to `end` (the backing
    file's name, else the first cluster's end); past the image's end (`head` is `whole`) it
    reads zeros, the end of the extensions."""
    offset = start
    while offset < end:
        if offset + _EXTENSION.size > len(head) and not whole:
            return "the qcow2 image's header extensions reach past the first MiB, which is judged"
        padded = head.ljust(offset + _EXTENSION.size, b"\0")  # zeros past the image's end
        extension, length = _EXTENSION.unpack_from(padded, offset)
        offset += _EXTENSION.size
        if offset > end or length > end - offset:
            return "the qcow2 image's header extension is larger than its header (qemu refuses it)"
        if extension == _EXTENSION_END:
            return None
        problem = _extension_problem(extension, length, header.crypt_method)
        if problem is not None:
            return problem
        offset += -(-length // 8) * 8
    return None


def _extension_problem(extension: int, length: int, crypt_method: int) -> str | None:
    """What qemu refuses in one extension whatever its data says (a bitmaps extension's length
    is checked whatever the autoclear bits say)."""
    if extension == _BACKING_FORMAT and length >= _MAX_BACKING_FORMAT_BYTES:
        return "the qcow2 image's backing format name is longer than qemu reads"
    if extension == _CRYPTO_HEADER and crypt_method != _LUKS:
        return "the qcow2 image has a LUKS header extension but is not LUKS-encrypted"
    if extension == _BITMAPS and length != _BITMAPS_EXTENSION_BYTES:
        return "the qcow2 image's bitmaps extension has a length qemu refuses"
    return None


def _tables_problem(header: _Header) -> str | None:
    """qemu's checks of the tables the header places (qcow2_validate_table): each starts on a
    cluster and ends within a signed 64-bit offset, none is larger than qemu reads, there is a
    refcount table, and the L1 table covers the disk."""
    cluster = 1 << header.cluster_bits
    if header.refcount_clusters == 0:
        return "the qcow2 image has no refcount table (qemu refuses it)"
    tables = (
        ("L1 table", header.l1_offset, header.l1_entries * 8, MAX_L1_ENTRIES * 8, "32 MiB"),
        (
            "refcount table",
            header.refcount_offset,
            header.refcount_clusters * cluster,
            MAX_REFCOUNT_TABLE_BYTES,
            "8 MiB",
        ),
        (
            "snapshot table",
            header.snapshots_offset,
            header.snapshots * SNAPSHOT_HEADER_BYTES,
            MAX_SNAPSHOTS * SNAPSHOT_HEADER_BYTES,
            "65536 snapshots",
        ),
    )
    for name, offset, length, largest, largest_said in tables:
        if length > largest:
            return f"the qcow2 image's {name} is larger than qemu reads ({largest_said})"
        if offset % cluster or offset > _INT64_MAX - length:
            return f"the qcow2 image's {name} does not start on a cluster (qemu refuses it)"
    if header.snapshots and header.snapshots_offset < cluster:
        return (
            "the qcow2 image's snapshot table lies in its header's cluster (qemu-img check "
            "reads the header as a snapshot and finds it corrupt)"
        )
    l2_entry_bytes = 16 if header.features & QCOW2_EXTENDED_L2 else 8
    covered_by_one_entry = cluster * (cluster // l2_entry_bytes)
    if header.l1_entries * covered_by_one_entry < header.size:
        return "the qcow2 image's L1 table is too small for its disk (qemu refuses it)"
    return None
