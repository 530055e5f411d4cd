"""Where the structures of a seed image lie, for the fuzzer to aim at: every field is named by
its place in qemu's on-disk layouts (qcow2: docs/interop/qcow2.txt; a sparse vmdk: VMware's
"Virtual Disk Format 5.0" as block/vmdk.c reads it).

qcow2: the header's fields and its extensions, the L1 table, every L2 table, the refcount
table and its blocks, and each compressed cluster's deflated bytes. streamOptimized vmdk: the
sparse header (and the footer's copy, where the grain directory is at the end), every marker
(a grain's sector and length, a table's sector count and type), the grain directory and grain
tables (qemu reads the disk through them) and each grain's deflated bytes."""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Literal

Order = Literal["big", "little"]


@dataclass(frozen=True)
class Field:
    """An unsigned integer of `width` bytes at `offset`; `kind` names the structure (a
    header's field, "L2 entry", ...) whatever its place."""

    kind: str
    name: str
    offset: int
    width: int
    order: Order


@dataclass(frozen=True)
class Span:
    """Opaque bytes (a deflated cluster or grain)."""

    kind: str
    name: str
    offset: int
    length: int


@dataclass(frozen=True)
class Layout:
    """A seed image's targets, by kind of structure; `offsets` are the places its structures
    start at (values worth pointing a table entry or an offset field at)."""

    fields: dict[str, list[Field]]
    spans: list[Span]
    offsets: list[int]
    unit: int  # a cluster, or a sector for a vmdk (the unit its offsets count in)


# qcow2's header: (name, offset, width); the fields past 72 are version 3's.
_QCOW2_HEADER = [
    ("magic", 0, 4),
    ("version", 4, 4),
    ("backing_file_offset", 8, 8),
    ("backing_file_size", 16, 4),
    ("cluster_bits", 20, 4),
    ("size", 24, 8),
    ("crypt_method", 32, 4),
    ("l1_size", 36, 4),
    ("l1_table_offset", 40, 8),
    ("refcount_table_offset", 48, 8),
    ("refcount_table_clusters", 56, 4),
    ("nb_snapshots", 60, 4),
    ("snapshots_offset", 64, 8),
]
_QCOW2_HEADER_V3 = [
    ("incompatible_features", 72, 8),
    ("compatible_features", 80, 8),
    ("autoclear_features", 88, 8),
    ("refcount_order", 96, 4),
    ("header_length", 100, 4),
    ("compression_type", 104, 1),
]
QCOW2_OFFSET_MASK = 0x00FFFFFFFFFFFE00
QCOW2_COMPRESSED = 1 << 62
QCOW2_EXTENDED_L2 = 1 << 4  # an incompatible feature: each L2 entry followed by a bitmap


def qcow2_layout(image: bytes) -> Layout:
    version, cluster_bits, l1_size, l1_offset, refcount_offset, refcount_clusters = (
        struct.unpack_from(">4xI12xI12xIQQI", image)
    )
    cluster = 1 << cluster_bits
    header = _QCOW2_HEADER + (_QCOW2_HEADER_V3 if version >= 3 else [])
    fields: dict[str, list[Field]] = {
        "header": [
            Field(f"header {name}", f"header {name}", at, width, "big")
            for name, at, width in header
        ]
    }
    extensions = []
    at = struct.unpack_from(">I", image, 100)[0] if version >= 3 else 72
    while at + 8 <= cluster:
        kind, length = struct.unpack_from(">II", image, at)
        extensions += [
            Field("header extension type", f"header extension {kind:#x} type", at, 4, "big"),
            Field(
                "header extension length", f"header extension {kind:#x} length", at + 4, 4, "big"
            ),
        ]
        if kind == 0:
            break
        at += 8 + (length + 7) // 8 * 8
    fields["header extension"] = extensions
    fields["L1 entry"] = _entries("L1 entry", "L1 entry", image, l1_offset, l1_size, 8, "big")
    l2_tables = [
        entry & QCOW2_OFFSET_MASK
        for entry in struct.unpack_from(f">{l1_size}Q", image, l1_offset)
        if entry & QCOW2_OFFSET_MASK
    ]
    features = struct.unpack_from(">Q", image, 72)[0] if version >= 3 else 0
    # An extended L2 entry is 16 bytes: the entry, then its subcluster bitmap.
    l2_entry_bytes = 16 if features & QCOW2_EXTENDED_L2 else 8
    fields["L2 entry"] = []
    if l2_entry_bytes == 16:
        fields["L2 subcluster bitmap"] = []
    spans = []
    compressed_bits = 62 - (cluster_bits - 8)
    for table in l2_tables:
        slots = _entries(
            "L2 entry",
            f"L2 entry (table at {table})",
            image,
            table,
            cluster // l2_entry_bytes,
            l2_entry_bytes,
            "big",
        )
        entries = [replace(slot, width=8) for slot in slots]
        fields["L2 entry"] += entries
        if l2_entry_bytes == 16:
            fields["L2 subcluster bitmap"] += [
                Field("L2 subcluster bitmap", f"{slot.name} bitmap", slot.offset + 8, 8, "big")
                for slot in slots
            ]
        for entry in entries:
            (value,) = struct.unpack_from(">Q", image, entry.offset)
            if value & QCOW2_COMPRESSED:
                start = value & ((1 << compressed_bits) - 1)
                sectors = ((value >> compressed_bits) & ((1 << (62 - compressed_bits)) - 1)) + 1
                length = min(sectors * 512 - start % 512, len(image) - start)
                spans.append(
                    Span("compressed cluster", f"compressed cluster at {start}", start, length)
                )
    refcount_entries = refcount_clusters * cluster // 8
    fields["refcount table entry"] = _entries(
        "refcount table entry",
        "refcount table entry",
        image,
        refcount_offset,
        refcount_entries,
        8,
        "big",
    )
    refcount_order = struct.unpack_from(">I", image, 96)[0] if version >= 3 else 4
    refcount_width = (1 << refcount_order) // 8
    blocks = [
        entry & QCOW2_OFFSET_MASK
        for entry in struct.unpack_from(f">{refcount_entries}Q", image, refcount_offset)
        if entry & QCOW2_OFFSET_MASK
    ]
    used_clusters = -(-len(image) // cluster) + 2  # and a couple past the end
    fields["refcount block entry"] = [
        entry
        for block in blocks
        for entry in _entries(
            "refcount block entry",
            f"refcount block entry (block at {block})",
            image,
            block,
            min(used_clusters, cluster // refcount_width),
            refcount_width,
            "big",
        )
    ]
    offsets = sorted({0, l1_offset, refcount_offset, *l2_tables, *blocks, len(image)})
    return Layout(fields, spans, offsets, cluster)


# A sparse vmdk's header (little-endian): (name, offset, width).
_VMDK_HEADER = [
    ("magic", 0, 4),
    ("version", 4, 4),
    ("flags", 8, 4),
    ("capacity", 12, 8),
    ("grainSize", 20, 8),
    ("descriptorOffset", 28, 8),
    ("descriptorSize", 36, 8),
    ("numGTEsPerGT", 44, 4),
    ("rgdOffset", 48, 8),
    ("gdOffset", 56, 8),
    ("overHead", 64, 8),
    ("uncleanShutdown", 72, 1),
    ("newline detection", 73, 4),
    ("compressAlgorithm", 77, 2),
]
SECTOR = 512
GD_AT_END = 0xFFFF_FFFF_FFFF_FFFF
_MARKER_NAMES = {0: "end-of-stream", 1: "grain table", 2: "grain directory", 3: "footer"}


def vmdk_layout(image: bytes) -> Layout:
    fields: dict[str, list[Field]] = {
        "header": _vmdk_header("header", 0),
        "grain marker": [],
        "metadata marker": [],
    }
    spans = []
    offsets = {0, len(image)}
    capacity, grain, per_table, rgd, gd, overhead = struct.unpack_from("<12xQQ16xIQQQ", image)
    at = overhead * SECTOR
    while at + SECTOR <= len(image):
        offsets.add(at)
        lba, size = struct.unpack_from("<QI", image, at)
        if size:
            fields["grain marker"] += [
                Field("grain marker sector", f"grain marker at {at} sector", at, 8, "little"),
                Field("grain marker length", f"grain marker at {at} length", at + 8, 4, "little"),
            ]
            spans.append(Span("deflated grain", f"deflated grain at {at}", at + 12, size))
            at += -(-(12 + size) // SECTOR) * SECTOR
            continue
        (kind,) = struct.unpack_from("<I", image, at + 12)
        name = _MARKER_NAMES.get(kind, str(kind))
        fields["metadata marker"] += [
            Field(f"{name} marker sectors", f"{name} marker at {at} sectors", at, 8, "little"),
            Field(f"{name} marker type", f"{name} marker at {at} type", at + 12, 4, "little"),
        ]
        if kind == 3:
            fields["footer"] = _vmdk_header("footer", at + SECTOR)
            gd = struct.unpack_from("<Q", image, at + SECTOR + 56)[0]
        if kind == 0:
            break
        at += SECTOR + lba * SECTOR
    tables = -(-capacity // (grain * per_table))
    fields["grain directory entry"] = []
    fields["grain table entry"] = []
    for directory in {rgd, gd} - {0, GD_AT_END}:
        fields["grain directory entry"] += _entries(
            "grain directory entry",
            f"grain directory entry (at sector {directory})",
            image,
            directory * SECTOR,
            tables,
            4,
            "little",
        )
        for table in struct.unpack_from(f"<{tables}I", image, directory * SECTOR):
            if table:
                offsets.add(table * SECTOR)
                fields["grain table entry"] += _entries(
                    "grain table entry",
                    f"grain table entry (table at sector {table})",
                    image,
                    table * SECTOR,
                    per_table,
                    4,
                    "little",
                )
    return Layout(fields, spans, sorted(offsets), SECTOR)


def _vmdk_header(where: str, at: int) -> list[Field]:
    return [
        Field(f"{where} {name}", f"{where} {name}", at + start, width, "little")
        for name, start, width in _VMDK_HEADER
    ]


def _entries(
    kind: str, name: str, image: bytes, at: int, count: int, width: int, order: Order
) -> list[Field]:
    count = max(0, min(count, (len(image) - at) // width))
    return [
        Field(kind, f"{name} {index}", at + index * width, width, order) for index in range(count)
    ]
