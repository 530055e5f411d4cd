"""The guest's first sectors (what `domain/boot_sectors.py` judges), captured from a disk
image's bytes as they stream past on their way to the hypervisor, never read back.

A raw image's are its prefix. A qcow2's are found through its tables: the header says where
the L1 table is, L1 entry 0 where the L2 table is, L2 entry 0 where guest cluster 0 lies
(inflated when compressed). A streamOptimized vmdk's are in its first grains, whose markers
name the sector they hold; a monolithicSparse vmdk's are found through its grain directory
and grain table. The format is named by the magic numbers the image judge names it by
(`inspection.py`).

A stream passes once, and a format may place a table after the data it maps (this project's
own qcow2 writer writes the data clusters first, `qcow2.py`), so the image's first
WINDOW_BYTES are held until the answer is known: a piece that lies within them is found
whenever it is asked for; one that lies beyond them is caught as it passes, if it is asked for
before. One that went by unseen, or lies past the image's end, makes the answer None, as do a
backing file, encryption, an external data file, zstd compression (the standard library has
no zstd) and any malformed table. Memory is bounded whatever the bytes claim: the window
(1 MiB), the pieces asked for at once (at most MAX_WANTED_BYTES, 4 MiB and 64 KiB: compressed
clusters or grains, each at most what its format's size field can say) and the answer.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Generator
from dataclasses import dataclass, field

from pyrigaud.adapters.disk_images.blocks import SECTOR_BYTES, round_up
from pyrigaud.adapters.disk_images.qcow2 import MAGIC as QCOW2_MAGIC
from pyrigaud.adapters.disk_images.qcow2_tables import (
    COMPRESSED,
    MAX_CLUSTER_BITS,
    MIN_CLUSTER_BITS,
    OFFSET_MASK,
    QCOW2_CORRUPT,
    QCOW2_EXTENDED_L2,
    QCOW2_FEATURES_OFFSET,
    QCOW2_KNOWN_FEATURES,
)
from pyrigaud.adapters.disk_images.stream_optimized_grains import (
    COMPRESS_DEFLATE,
    FLAG_COMPRESSED,
    FLAG_MARKERS,
    GD_AT_END,
    GRAIN_MARKER,
    LARGEST_GRAIN_SECTORS,
    MARKER_EOS,
    MARKER_FOOTER,
    MARKER_GD,
    MARKER_GT,
    sparse_header,
)
from pyrigaud.adapters.disk_images.stream_optimized_grains import MAGIC as VMDK_MAGIC
from pyrigaud.domain.boot_sectors import FIRST_SECTORS_BYTES

WINDOW_BYTES = 1024 * 1024
MAX_WANTED_BYTES = 4 * 1024 * 1024 + FIRST_SECTORS_BYTES
# qcow2 (qemu's docs/interop/qcow2.txt): the header to its L1 table's offset (magic, version,
# backing file offset and size, cluster bits, size, encryption, L1 entries, L1 offset).
_QCOW2_HEADER = struct.Struct(">4sIQIIQIIQ")
_QCOW2_V3_HEADER_BYTES = 104
_QCOW2_EXTERNAL_DATA = 1 << 2
_QCOW2_COMPRESSION_TYPE = 1 << 3  # then the type is the header's byte 104: 0 zlib, 1 zstd
_QCOW2_HEADER_LENGTH_OFFSET = 100
_QCOW2_ZERO = 1  # an L2 entry's bit 0: the cluster reads as zeros
_QCOW2_DEFLATE_WINDOW_BITS = -12  # raw deflate with a 4 KiB window, as qemu inflates it
_SUBCLUSTERS = 32  # of a cluster, with extended L2 entries
# vmdk (VMware's Virtual Disk Format 1.1): a grain table entry of 1 is a zeroed grain when the
# header's flag says so; qemu reads tables of at most 512 entries.
_VMDK_ZEROED_GRAIN_FLAG = 1 << 2
_VMDK_ZEROED_GRAIN = 1
_VMDK_MAX_TABLE_ENTRIES = 512
_VMDK_MARKER_TYPE = struct.Struct("<I")


@dataclass
class _Span:
    """Bytes of the image asked for: `length` from `offset`; `until_end`: fewer where the
    image ends first is what there is."""

    offset: int
    length: int
    until_end: bool = False
    data: bytearray = field(default_factory=bytearray)

    @property
    def reached(self) -> int:
        """The next byte of the image the span still needs."""
        return self.offset + len(self.data)

    def full(self) -> bool:
        return len(self.data) == self.length

    def fill(self, source: bytes | bytearray | memoryview, source_start: int) -> None:
        """Take what `source` (the image's bytes from `source_start`) holds of what is next."""
        needed, end = self.reached, self.offset + self.length
        if source_start <= needed < min(end, source_start + len(source)):
            self.data += source[needed - source_start : min(end - source_start, len(source))]


# A format's reading: asks for spans (all at once, in any order of the file), is sent their
# bytes, and returns the guest's first bytes or None.
_Reading = Generator[list[_Span], list[bytes], bytes | None]


class FirstSectors:
    """One image's bytes, fed in order from its first (`feed`); the guest's first
    FIRST_SECTORS_BYTES (fewer on a smaller disk), or None, once the last was fed
    (`captured`)."""

    def __init__(self) -> None:
        self._window = bytearray()  # the image's first WINDOW_BYTES, until the answer
        self._fed = 0
        self._ended = False
        self._reading: _Reading | None = _image()
        self._wanted: list[_Span] = []
        self._answer: bytes | None = None
        self._ask(next(self._reading))

    def feed(self, chunk: bytes) -> None:
        if self._reading is None:
            return
        start = self._fed
        self._fed += len(chunk)
        if len(self._window) < WINDOW_BYTES:
            self._window += chunk[: WINDOW_BYTES - len(self._window)]
        if any(span.reached < self._fed for span in self._wanted):
            self._settle(memoryview(chunk), start)

    def captured(self) -> bytes | None:
        """The guest's first bytes, once every byte of the image was fed; None when they
        cannot be told from the image's bytes (see the module's docstring)."""
        if self._reading is not None:
            self._ended = True
            self._settle(memoryview(b""), self._fed)
        return self._answer

    def _settle(self, chunk: memoryview, chunk_start: int) -> None:
        """Fill the spans asked for from the window and the chunk in hand; hand them over when
        all are full, as often as the reading asks for what is there already."""
        while self._reading is not None:
            for span in self._wanted:
                span.fill(self._window, 0)
                span.fill(chunk, chunk_start)
            done = [span.full() or (self._ended and span.until_end) for span in self._wanted]
            if all(done):
                self._send([bytes(span.data) for span in self._wanted])
            elif self._ended or any(
                span.reached < self._fed
                for span, full in zip(self._wanted, done, strict=True)
                if not full
            ):
                self._finish(None)  # past the image's end, or gone by unseen
            else:
                return

    def _send(self, pieces: list[bytes]) -> None:
        assert self._reading is not None
        try:
            self._ask(self._reading.send(pieces))
        except StopIteration as stop:
            self._finish(stop.value)

    def _ask(self, spans: list[_Span]) -> None:
        if sum(span.length for span in spans) > MAX_WANTED_BYTES or any(
            span.offset < 0 or span.length < 0 for span in spans
        ):
            self._finish(None)
            return
        self._wanted = spans

    def _finish(self, answer: bytes | None) -> None:
        if self._reading is not None:
            self._reading.close()
        self._reading = None
        self._answer = answer
        self._wanted = []
        self._window = bytearray()


def _image() -> _Reading:
    (start,) = yield [_Span(0, SECTOR_BYTES, until_end=True)]
    if start.startswith(QCOW2_MAGIC):
        return (yield from _qcow2(start))
    if start.startswith(VMDK_MAGIC):
        return (yield from _sparse_vmdk(start))
    (prefix,) = yield [_Span(0, FIRST_SECTORS_BYTES, until_end=True)]
    return prefix


def _qcow2(header: bytes) -> _Reading:
    if len(header) < SECTOR_BYTES:  # a qcow2 is never shorter than its first cluster
        return None
    (_, version, backing, _, cluster_bits, size, crypt, l1_entries, l1_offset) = (
        _QCOW2_HEADER.unpack_from(header)
    )
    features = struct.unpack_from(">Q", header, QCOW2_FEATURES_OFFSET)[0] if version == 3 else 0
    if (
        version not in (2, 3)
        or backing
        or crypt
        or not MIN_CLUSTER_BITS <= cluster_bits <= MAX_CLUSTER_BITS
        or features & (QCOW2_CORRUPT | _QCOW2_EXTERNAL_DATA | ~QCOW2_KNOWN_FEATURES)
        or _qcow2_zstd(header, features)
    ):
        return None
    cluster = 1 << cluster_bits
    wanted = min(size, FIRST_SECTORS_BYTES)
    clusters = -(-wanted // cluster)
    entry_bytes = 16 if features & QCOW2_EXTENDED_L2 else 8
    per_table = cluster // entry_bytes
    tables = min(-(-clusters // per_table), l1_entries)
    if l1_offset % cluster:
        return None
    l2_offsets: list[int] = []
    if tables:
        (l1,) = yield [_Span(l1_offset, tables * 8, until_end=True)]
        l1 = l1.ljust(tables * 8, b"\0")  # past the image's end, qemu reads zeros
        l2_offsets = [entry & OFFSET_MASK for (entry,) in struct.iter_unpack(">Q", l1)]
    if any(offset % cluster for offset in l2_offsets):
        return None
    allocated = [(table, offset) for table, offset in enumerate(l2_offsets) if offset]
    counts = [min(per_table, clusters - table * per_table) for table, _ in allocated]
    l2_tables = yield [
        _Span(offset, count * entry_bytes, until_end=True)
        for (_, offset), count in zip(allocated, counts, strict=True)
    ]
    # Each guest cluster's L2 entry and, with extended L2 entries, its subcluster bitmap.
    entries: dict[int, tuple[int, int | None]] = {}
    for (table, _), count, passed in zip(allocated, counts, l2_tables, strict=True):
        l2 = passed.ljust(count * entry_bytes, b"\0")
        for start in range(0, len(l2), entry_bytes):
            entry = int.from_bytes(l2[start : start + 8], "big")
            bitmap = (
                int.from_bytes(l2[start + 8 : start + 16], "big") if entry_bytes == 16 else None
            )
            entries[table * per_table + start // entry_bytes] = (entry, bitmap)
    return (yield from _qcow2_clusters(entries, cluster_bits, wanted))


def _qcow2_zstd(header: bytes, features: int) -> bool:
    if not features & _QCOW2_COMPRESSION_TYPE:
        return False
    (length,) = struct.unpack_from(">I", header, _QCOW2_HEADER_LENGTH_OFFSET)
    return length <= _QCOW2_V3_HEADER_BYTES or header[_QCOW2_V3_HEADER_BYTES] != 0


def _qcow2_clusters(
    entries: dict[int, tuple[int, int | None]], cluster_bits: int, wanted: int
) -> _Reading:
    """The first `wanted` bytes of the guest from its clusters' L2 entries and subcluster
    bitmaps (a cluster without an entry reads as zeros)."""
    cluster = 1 << cluster_bits
    compressed: list[tuple[int, _Span]] = []  # guest cluster, its deflated bytes
    stored: list[tuple[int, _Span, int | None]] = []  # guest cluster, its bytes, bitmap
    for index, (entry, bitmap) in sorted(entries.items()):
        if entry & COMPRESSED:
            # The offset's bits, then the count of 512-byte sectors after the first it spans.
            offset_bits = 62 - (cluster_bits - 8)
            offset = entry & ((1 << offset_bits) - 1)
            sectors = ((entry >> offset_bits) & ((1 << (cluster_bits - 8)) - 1)) + 1
            deflated = sectors * SECTOR_BYTES - offset % SECTOR_BYTES
            compressed.append((index, _Span(offset, deflated, until_end=True)))
            continue
        offset = entry & OFFSET_MASK
        if offset % cluster or (bitmap is not None and bitmap & (bitmap >> _SUBCLUSTERS)):
            return None  # qemu: corrupt (data off a cluster, a subcluster allocated and zero)
        if offset and not (bitmap is None and entry & _QCOW2_ZERO):
            length = min(cluster, wanted - index * cluster)
            stored.append((index, _Span(offset, length, until_end=True), bitmap))
    pieces = yield [span for _, span in compressed] + [span for _, span, _ in stored]
    disk = bytearray(wanted)
    for (index, _), piece in zip(compressed, pieces, strict=False):
        length = min(cluster, wanted - index * cluster)
        inflated = _inflated(piece, length, _QCOW2_DEFLATE_WINDOW_BITS)
        if inflated is None:
            return None
        disk[index * cluster : index * cluster + length] = inflated
    for (index, span, bitmap), piece in zip(stored, pieces[len(compressed) :], strict=True):
        disk[index * cluster : index * cluster + len(piece)] = piece
        if bitmap is not None:
            _zero_unallocated_subclusters(disk, index * cluster, span.length, cluster, bitmap)
    return bytes(disk)


def _zero_unallocated_subclusters(
    disk: bytearray, start: int, length: int, cluster: int, bitmap: int
) -> None:
    """An extended L2 entry's subclusters not allocated, or zeroed, read as zeros."""
    subcluster = cluster // _SUBCLUSTERS
    for index in range(-(-length // subcluster)):
        allocated = bitmap >> index & 1 and not bitmap >> (_SUBCLUSTERS + index) & 1
        if not allocated:
            begin = start + index * subcluster
            end = min(begin + subcluster, start + length)
            disk[begin:end] = bytes(end - begin)


def _sparse_vmdk(header: bytes) -> _Reading:
    read = sparse_header(header)
    if read is None:
        return None
    flags, capacity, grain_sectors = read.flags, read.capacity, read.grain_sectors
    table_entries, directory, overhead = read.table_entries, read.directory, read.overhead
    algorithm = read.algorithm
    if not 1 <= grain_sectors <= LARGEST_GRAIN_SECTORS:
        return None
    wanted = min(capacity * SECTOR_BYTES, FIRST_SECTORS_BYTES)
    if flags & (FLAG_COMPRESSED | FLAG_MARKERS) == FLAG_COMPRESSED | FLAG_MARKERS:
        if algorithm != COMPRESS_DEFLATE:
            return None
        return (yield from _stream_grains(overhead, grain_sectors * SECTOR_BYTES, wanted))
    if flags & (FLAG_COMPRESSED | FLAG_MARKERS) or directory == GD_AT_END:
        return None
    if not 1 <= table_entries <= _VMDK_MAX_TABLE_ENTRIES:
        return None
    zeroed = bool(flags & _VMDK_ZEROED_GRAIN_FLAG)
    return (yield from _sparse_grains(directory, table_entries, grain_sectors, wanted, zeroed))


def _stream_grains(overhead: int, grain_bytes: int, wanted: int) -> _Reading:
    """A streamOptimized vmdk's first grains, read by their markers from its first one on
    (grains come in increasing order; metadata markers are passed over unread)."""
    disk = bytearray(wanted)
    position = overhead * SECTOR_BYTES
    next_free = 0  # the first guest byte a following grain may start at
    while next_free < wanted:
        (sector,) = yield [_Span(position, SECTOR_BYTES, until_end=True)]
        if len(sector) < GRAIN_MARKER.size + _VMDK_MARKER_TYPE.size:
            return None
        lba, stored = GRAIN_MARKER.unpack_from(sector)
        if stored == 0:
            (kind,) = _VMDK_MARKER_TYPE.unpack_from(sector, GRAIN_MARKER.size)
            if kind == MARKER_EOS:
                break
            if kind not in (MARKER_GT, MARKER_GD, MARKER_FOOTER):
                return None
            position += SECTOR_BYTES + lba * SECTOR_BYTES
            continue
        start = lba * SECTOR_BYTES
        if start < next_free or stored > 2 * grain_bytes + SECTOR_BYTES:
            return None  # out of order, or a compressed size no grain of its size has
        if start >= wanted:
            break
        (compressed,) = yield [_Span(position + GRAIN_MARKER.size, stored)]
        length = min(grain_bytes, wanted - start)
        inflated = _inflated(compressed, length, zlib.MAX_WBITS)
        if inflated is None:
            return None
        disk[start : start + length] = inflated
        position = round_up(position + GRAIN_MARKER.size + stored, SECTOR_BYTES)
        next_free = start + grain_bytes
    return bytes(disk)


def _sparse_grains(
    directory: int, table_entries: int, grain_sectors: int, wanted: int, zeroed: bool
) -> _Reading:
    """A monolithicSparse vmdk's first grains, through its grain directory and tables."""
    grain_bytes = grain_sectors * SECTOR_BYTES
    grains = -(-wanted // grain_bytes)
    if not grains:
        return b""
    tables = -(-grains // table_entries)
    (gd,) = yield [_Span(directory * SECTOR_BYTES, tables * 4, until_end=True)]
    gd = gd.ljust(tables * 4, b"\0")  # past the image's end, qemu reads zeros
    table_sectors = [sector for (sector,) in struct.iter_unpack("<I", gd)]
    allocated = [(table, sector) for table, sector in enumerate(table_sectors) if sector]
    counts = [min(table_entries, grains - table * table_entries) for table, _ in allocated]
    gts = yield [
        _Span(sector * SECTOR_BYTES, count * 4, until_end=True)
        for (_, sector), count in zip(allocated, counts, strict=True)
    ]
    placed: list[tuple[int, _Span]] = []
    for (table, _), count, gt in zip(allocated, counts, gts, strict=True):
        for index, (sector,) in enumerate(struct.iter_unpack("<I", gt.ljust(count * 4, b"\0"))):
            grain = table * table_entries + index
            if sector and not (zeroed and sector == _VMDK_ZEROED_GRAIN):
                length = min(grain_bytes, wanted - grain * grain_bytes)
                placed.append((grain, _Span(sector * SECTOR_BYTES, length, until_end=True)))
    pieces = yield [span for _, span in placed]
    disk = bytearray(wanted)
    for (grain, _), piece in zip(placed, pieces, strict=True):
        disk[grain * grain_bytes : grain * grain_bytes + len(piece)] = piece
    return bytes(disk)


def _inflated(compressed: bytes, length: int, window_bits: int) -> bytes | None:
    """The first `length` bytes `compressed` inflates to (never more held), or None when it
    does not inflate to as many."""
    inflater = zlib.decompressobj(window_bits)
    try:
        data = inflater.decompress(compressed, length)
    except zlib.error:
        return None
    return data if len(data) == length else None
