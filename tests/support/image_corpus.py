"""Disk images of every kind a user hands over, made by qemu-img and qemu-io, and crafted ones.

`VALID` are the formats and features a staged disk may have (qcow2 v2 and v3, cluster
sizes from 512 B to 2 MiB, zlib and zstd compression, extended L2 entries, lazy refcounts, an
internal snapshot older than the disk's current state, both single-file vmdk kinds, a raw disk
of an odd size), each a few MiB with data in its first and last clusters. What qemu reads from
one (`oracle_raw`) is what a migrated disk must hold.

`HOSTILE` are real images with one header field or table entry bent the way an attacker
or a broken tool would: sizes far above any bound, tables of absurd size or at misaligned
offsets, headers cut short, vmdk grains and markers out of range. Each is refused, by the judge
or by qemu itself, never read as a disk.
"""

from __future__ import annotations

import struct
import subprocess
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from support.disk_image import MIB, qemu_img, sparse_disk

# Odd on purpose: not a multiple of a sector, a cluster or a grain; data in the last bytes.
SOURCE_BYTES = 3 * MIB + 1234


@dataclass(frozen=True)
class CorpusImage:
    name: str
    path: Path
    format: str  # as qemu-img names it


def source_disk(workdir: Path) -> Path:
    """The disk every valid image holds: random, zero and nearly-zero grains, odd-sized."""
    raw = workdir / "source.raw"
    if not raw.exists():
        disk = bytearray(sparse_disk(SOURCE_BYTES, seed=25))
        disk[-4096:] = b"\xa5" * 4096  # data in the last cluster, whatever its size
        raw.write_bytes(bytes(disk))
    return raw


# Each valid image: how qemu-img makes it from the source disk (its format, its options).
VALID = {
    "raw-odd-size": ("raw", ()),
    "qcow2-v2": ("qcow2", ("-o", "compat=0.10")),
    "qcow2-v3": ("qcow2", ()),
    "qcow2-512-byte-clusters": ("qcow2", ("-o", "cluster_size=512")),
    "qcow2-2-mib-clusters": ("qcow2", ("-o", "cluster_size=2M")),
    "qcow2-zlib": ("qcow2", ("-c",)),
    "qcow2-zstd": ("qcow2", ("-c", "-o", "compression_type=zstd")),
    "qcow2-extended-l2": ("qcow2", ("-o", "extended_l2=on,cluster_size=128k")),
    "qcow2-lazy-refcounts": ("qcow2", ("-o", "lazy_refcounts=on")),
    "qcow2-internal-snapshot": ("qcow2", ()),  # then a snapshot, then a write after it
    "vmdk-stream-optimized": ("vmdk", ("-o", "subformat=streamOptimized")),
    "vmdk-monolithic-sparse": ("vmdk", ("-o", "subformat=monolithicSparse")),
    # qemu-img's own streamOptimized places its grain directory in its header: it reads one
    # that ends without its end-of-stream marker alike.
    "vmdk-stream-optimized-without-end-of-stream": ("vmdk", ("-o", "subformat=streamOptimized")),
}


def valid_image(name: str, workdir: Path) -> CorpusImage:
    """The valid image `name` (made once per `workdir`)."""
    disk_format, options = VALID[name]
    image = CorpusImage(name, workdir / f"{name}.{disk_format}", disk_format)
    if not image.path.exists():
        qemu_img(
            "convert", "-f", "raw", "-O", disk_format, *options, source_disk(workdir), image.path
        )
        if name == "qcow2-internal-snapshot":
            # The snapshot holds the disk as it was; the current state, which is the disk,
            # differs in its last 64 KiB.
            qemu_img("snapshot", "-c", "before", image.path)
            last = SOURCE_BYTES - SOURCE_BYTES % 512 - 65536
            subprocess.run(
                ["qemu-io", "-f", "qcow2", "-c", f"write -P 0x5a {last} 65536", str(image.path)],
                check=True,
                capture_output=True,
            )
        if name == "vmdk-stream-optimized-without-end-of-stream":
            data = bytearray(image.path.read_bytes())
            del data[_end_of_stream(data) :]
            image.path.write_bytes(bytes(data))
    return image


def staged_valid_images(put: Callable[[str, bytes], None], workdir: Path) -> dict[str, CorpusImage]:
    """Every valid image, made in `workdir` and `put` on a staging store under its file name."""
    workdir.mkdir(exist_ok=True)
    images = {name: valid_image(name, workdir) for name in sorted(VALID)}
    for image in images.values():
        put(image.path.name, image.path.read_bytes())
    return images


def _vmdk_records(data: bytearray) -> Iterator[tuple[int, int, int]]:
    """A streamOptimized vmdk's records from its first grain on: (offset, the marker's first
    field (a grain's sector, or the sectors of metadata), its compressed size (0: metadata))."""
    offset = 512 * struct.unpack_from("<Q", data, 64)[0]  # overHead: where grains start
    while offset + 12 <= len(data):
        lba, size = struct.unpack_from("<QI", data, offset)
        yield offset, lba, size
        offset += -(-(12 + size) // 512) * 512 if size else 512 + lba * 512


def _end_of_stream(data: bytearray) -> int:
    """Where a streamOptimized vmdk's end-of-stream marker is."""
    for offset, lba, size in _vmdk_records(data):
        if not size and not lba and struct.unpack_from("<I", data, offset + 12) == (0,):
            return offset
    raise AssertionError("no end-of-stream marker")


def _first_grain(data: bytearray) -> tuple[int, int]:
    """A streamOptimized vmdk's first grain record: its offset and sector."""
    offset, lba, _ = next(record for record in _vmdk_records(data) if record[2])
    return offset, lba


def oracle_raw(image: CorpusImage, workdir: Path) -> bytes:
    """The disk as qemu reads it from the image."""
    out = workdir / f"{image.name}.oracle.raw"
    if not out.exists():
        qemu_img("convert", "-f", image.format, "-O", "raw", image.path, out)
    return out.read_bytes()


# qcow2's header fields (qemu's docs/interop/qcow2.txt), as (offset, struct format).
QCOW2_CLUSTER_BITS = (20, ">I")
QCOW2_SIZE = (24, ">Q")
QCOW2_L1_SIZE = (36, ">I")
QCOW2_L1_OFFSET = (40, ">Q")
QCOW2_REFCOUNT_OFFSET = (48, ">Q")
QCOW2_SNAPSHOT_COUNT = (60, ">I")
# A sparse vmdk's header (VMware's Virtual Disk Format 1.1, SparseExtentHeader).
VMDK_CAPACITY = (12, "<Q")
VMDK_GRAIN_SIZE = (20, "<Q")
VMDK_GTES_PER_GT = (44, "<I")
VMDK_OVERHEAD = (64, "<Q")
VMDK_COMPRESS_ALGORITHM = (77, "<H")
L2_OFFSET_MASK = 0x00FFFFFFFFFFFE00
QCOW2_COMPRESSED = 1 << 62
QCOW2_COMPRESSED_OFFSET_MASK = (1 << 54) - 1  # of 64 KiB clusters
QCOW2_HEADER_LENGTH = (100, ">I")
QCOW2_COMPRESSION_TYPE = (104, ">B")


def _set(field: tuple[int, str], value: int) -> Callable[[bytearray], None]:
    offset, layout = field
    return lambda data: struct.pack_into(layout, data, offset, value)


def _add(field: tuple[int, str], delta: int) -> Callable[[bytearray], None]:
    offset, layout = field

    def bend(data: bytearray) -> None:
        (value,) = struct.unpack_from(layout, data, offset)
        struct.pack_into(layout, data, offset, value + delta)

    return bend


def _misaligned_l2_entry(data: bytearray) -> None:
    """The first allocated L2 entry points a sector past a cluster's start (qemu: corrupt)."""
    (l1_offset,) = struct.unpack_from(">Q", data, QCOW2_L1_OFFSET[0])
    (l1_entry,) = struct.unpack_from(">Q", data, l1_offset)
    l2_offset = l1_entry & L2_OFFSET_MASK
    for index in range(0, 65536 // 8):
        (entry,) = struct.unpack_from(">Q", data, l2_offset + index * 8)
        if entry & L2_OFFSET_MASK:
            struct.pack_into(">Q", data, l2_offset + index * 8, entry + 512)
            return
    raise AssertionError("no allocated cluster in the first L2 table")


def _compressed_entries(data: bytearray) -> list[tuple[int, int]]:
    """Where the first L2 table's compressed cluster descriptors are, and their values (64 KiB
    clusters: 54 offset bits, then the count of further 512-byte sectors)."""
    (l1_offset,) = struct.unpack_from(">Q", data, QCOW2_L1_OFFSET[0])
    (l1_entry,) = struct.unpack_from(">Q", data, l1_offset)
    l2_offset = l1_entry & L2_OFFSET_MASK
    table = data[l2_offset : l2_offset + 65536]
    entries = [
        (l2_offset + index * 8, entry)
        for index, (entry,) in enumerate(struct.iter_unpack(">Q", table))
        if entry & QCOW2_COMPRESSED
    ]
    assert entries, "no compressed cluster in the first L2 table"
    return entries


def _first_compressed_entry(data: bytearray) -> tuple[int, int]:
    return _compressed_entries(data)[0]


def _compressed_past_the_end(data: bytearray) -> None:
    """A compressed cluster descriptor points a cluster past the file's end."""
    at, entry = _first_compressed_entry(data)
    sectors = entry & ~QCOW2_COMPRESSED_OFFSET_MASK
    struct.pack_into(">Q", data, at, sectors | len(data) + 65536)


def _compressed_garbage(data: bytearray) -> None:
    """A compressed cluster's bytes are not deflate."""
    _, entry = _first_compressed_entry(data)
    offset = entry & QCOW2_COMPRESSED_OFFSET_MASK
    data[offset : offset + 16] = b"\xff" * 16


def _compressed_short(data: bytearray) -> None:
    """A compressed cluster inflates to less than a cluster."""
    at, entry = _first_compressed_entry(data)
    offset = entry & QCOW2_COMPRESSED_OFFSET_MASK
    deflater = zlib.compressobj(9, zlib.DEFLATED, -12)
    short = deflater.compress(b"\xa5" * 1000) + deflater.flush()
    data[offset : offset + len(short)] = short
    sectors = (offset % 512 + len(short) - 1) // 512
    struct.pack_into(">Q", data, at, QCOW2_COMPRESSED | sectors << 54 | offset)


def _compressed_beyond_the_end_by_a_cluster(data: bytearray) -> None:
    """A compressed cluster's bytes, moved to the file's end, whose descriptor says they run a
    cluster past it (they inflate all the same: qemu reads it, qemu-img check finds it
    corrupt)."""
    at, entry = _first_compressed_entry(data)
    offset = _compressed_offset((at, entry))
    length = ((entry >> 54 & 0xFF) + 1) * 512 - offset % 512
    moved = -(-len(data) // 512) * 512
    data[len(data) :] = bytes(moved - len(data)) + data[offset : offset + length]
    struct.pack_into(">Q", data, at, QCOW2_COMPRESSED | 255 << 54 | moved)


def _compressed_offset(descriptor: tuple[int, int]) -> int:
    return descriptor[1] & QCOW2_COMPRESSED_OFFSET_MASK


def _cut(length: int) -> Callable[[bytearray], None]:
    def bend(data: bytearray) -> None:
        del data[length:]

    return bend


def _cut_in_half(data: bytearray) -> None:
    del data[len(data) // 2 :]


def _grain_marker_size(data: bytearray) -> None:
    """The first grain marker of a streamOptimized vmdk claims a compressed size of 4 GiB."""
    offset, _ = _first_grain(data)
    struct.pack_into("<I", data, offset + 8, 0xFFFFFFFF)


def _grain(inflated: bytes) -> Callable[[bytearray], None]:
    """The first grain of a streamOptimized vmdk deflates `inflated` (over what follows)."""

    def bend(data: bytearray) -> None:
        offset, lba = _first_grain(data)
        compressed = zlib.compress(inflated, 9)
        struct.pack_into("<QI", data, offset, lba, len(compressed))
        data[offset + 12 : offset + 12 + len(compressed)] = compressed

    return bend


def _first_grain_table(data: bytearray) -> int:
    """Where a streamOptimized vmdk's first grain table is, by the grain directory its header
    places (qemu-img places it there)."""
    directory = 512 * struct.unpack_from("<Q", data, 56)[0]  # gdOffset
    table: int = struct.unpack_from("<I", data, directory)[0]
    return 512 * table


def _grain_table_entries_swapped(data: bytearray) -> None:
    """The first grain table names the first two grains' markers the other way round: qemu
    reads each in the other's place, the markers say otherwise."""
    table = _first_grain_table(data)
    entries = list(struct.unpack_from("<512I", data, table))
    first, second = [index for index, sector in enumerate(entries) if sector][:2]
    entries[first], entries[second] = entries[second], entries[first]
    struct.pack_into("<512I", data, table, *entries)


def _grain_table_entry_dropped(data: bytearray) -> None:
    """The first grain table leaves the first grain out: qemu reads zeros there."""
    table = _first_grain_table(data)
    entries = list(struct.unpack_from("<512I", data, table))
    entries[next(index for index, sector in enumerate(entries) if sector)] = 0
    struct.pack_into("<512I", data, table, *entries)


def _grain_sector(sector: int) -> Callable[[bytearray], None]:
    def bend(data: bytearray) -> None:
        offset, _ = _first_grain(data)
        struct.pack_into("<Q", data, offset, sector)

    return bend


# Each hostile image: the valid image it is bent from, and the bend.
HOSTILE: dict[str, tuple[str, Callable[[bytearray], None]]] = {
    "qcow2-size-2-pow-62": ("qcow2-v3", _set(QCOW2_SIZE, 2**62)),
    "qcow2-size-a-petabyte": ("qcow2-v3", _set(QCOW2_SIZE, 2**50)),
    "qcow2-l1-of-a-billion-entries": ("qcow2-v3", _set(QCOW2_L1_SIZE, 2**30)),
    "qcow2-l1-misaligned": ("qcow2-v3", _add(QCOW2_L1_OFFSET, 1)),
    "qcow2-refcounts-misaligned": ("qcow2-v3", _add(QCOW2_REFCOUNT_OFFSET, 8)),
    "qcow2-cluster-bits-40": ("qcow2-v3", _set(QCOW2_CLUSTER_BITS, 40)),
    "qcow2-l2-entry-misaligned": ("qcow2-v3", _misaligned_l2_entry),
    "qcow2-snapshots-past-the-end": ("qcow2-v3", _set(QCOW2_SNAPSHOT_COUNT, 65536)),
    "qcow2-header-cut-short": ("qcow2-v3", _cut(48)),
    "qcow2-header-longer-than-its-cluster": (
        "qcow2-512-byte-clusters",
        _set(QCOW2_HEADER_LENGTH, 1024),
    ),
    "qcow2-compression-type-unknown": ("qcow2-v3", _set(QCOW2_COMPRESSION_TYPE, 7)),
    "qcow2-compressed-cluster-past-the-end": ("qcow2-zlib", _compressed_past_the_end),
    "qcow2-compressed-cluster-not-deflate": ("qcow2-zlib", _compressed_garbage),
    "qcow2-compressed-cluster-too-short": ("qcow2-zlib", _compressed_short),
    "qcow2-compressed-cluster-beyond-the-end": (
        "qcow2-zlib",
        _compressed_beyond_the_end_by_a_cluster,
    ),
    "vmdk-capacity-2-pow-60-sectors": ("vmdk-stream-optimized", _set(VMDK_CAPACITY, 2**60)),
    "vmdk-grain-of-a-terabyte": ("vmdk-stream-optimized", _set(VMDK_GRAIN_SIZE, 2**31)),
    "vmdk-grain-marker-of-4-gib": ("vmdk-stream-optimized", _grain_marker_size),
    "vmdk-stream-cut-in-half": ("vmdk-stream-optimized", _cut_in_half),
    "vmdk-overhead-of-2-pow-50-sectors": ("vmdk-stream-optimized", _set(VMDK_OVERHEAD, 2**50)),
    "vmdk-grains-not-deflate": ("vmdk-stream-optimized", _set(VMDK_COMPRESS_ALGORITHM, 2)),
    # 64 MiB of zeros in 64 KiB of deflate: a grain inflating a thousand times past its size.
    "vmdk-grain-deflate-bomb": ("vmdk-stream-optimized", _grain(bytes(64 * MIB))),
    "vmdk-grain-inflating-short": ("vmdk-stream-optimized", _grain(b"\1" * 1000)),
    "vmdk-grain-beyond-capacity": ("vmdk-stream-optimized", _grain_sector(2**40)),
    "vmdk-grain-tables-swap-two-grains": ("vmdk-stream-optimized", _grain_table_entries_swapped),
    "vmdk-grain-table-drops-a-grain": ("vmdk-stream-optimized", _grain_table_entry_dropped),
    "vmdk-tables-of-4-billion-entries": (
        "vmdk-monolithic-sparse",
        _set(VMDK_GTES_PER_GT, 2**32 - 1),
    ),
}


def hostile_image(name: str, workdir: Path) -> CorpusImage:
    """The hostile image `name` (made once per `workdir`)."""
    base_name, bend = HOSTILE[name]
    base = valid_image(base_name, workdir)
    image = CorpusImage(name, workdir / f"{name}.{base.format}", base.format)
    if not image.path.exists():
        data = bytearray(base.path.read_bytes())
        bend(data)
        image.path.write_bytes(bytes(data))
    return image
