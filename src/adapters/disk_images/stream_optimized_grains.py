"""How a streamOptimized vmdk's grains are read, one way for every reader: the export's decoder
pulls the bytes (`stream_optimized.decode_stream_optimized`), the image judge has them pushed as
they stream past (`StreamOptimizedCheck`), so what an import accepts the export reads alike.

The reading is a generator that asks for bytes (`Read`, `Skip`) and tells what it found (the
header's `Layout`, each `Grain` it inflated, the grain tables and directory its markers frame,
a `Footer`); it returns the disk's capacity once the stream ended as a whole one, or the
failure that ends it. Its rules are qemu's reading of a grain (block/vmdk.c,
vmdk_read_extent): a grain's compressed bytes are at most two grains, deflate in zlib's format,
whole (the stream ends) and inflating to one grain, the last one to at least what is left of
the disk. The grains come in increasing order, each at the start of a grain within the disk,
as VMware writes them and the export reads them. A stream ends with its end-of-stream marker;
one whose header places its grain directory (qemu reads the grains through it) may end
without it, where a marker would start, as qemu reads such an image; one whose grain directory
is at its end may not (qemu refuses it without the footer and end-of-stream marker), and its
footer must repeat the header (qemu reads the footer's). The judge also holds the grain tables
against the markers (`stream_optimized_tables.py`); the export, reading vCenter's own output,
does not.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Generator
from dataclasses import dataclass
from typing import NamedTuple

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.blocks import SECTOR_BYTES
from pyrigaud.adapters.disk_images.stream_optimized_tables import (
    MAX_TABLE_ENTRIES,
    TableAgreement,
)
from pyrigaud.domain.errors import ProviderError

MAGIC = b"KDMV"
FLAG_REDUNDANT_DIRECTORY = 1 << 1
FLAG_COMPRESSED = 1 << 16
LARGEST_SECTOR = 1 << 54  # qemu reads a sector's offset as a signed 64-bit byte offset
FLAG_MARKERS = 1 << 17
COMPRESS_NONE, COMPRESS_DEFLATE = 0, 1
GD_AT_END = 0xFFFF_FFFF_FFFF_FFFF
MARKER_EOS, MARKER_GT, MARKER_GD, MARKER_FOOTER = 0, 1, 2, 3
# The sparse extent header: magic, version, flags, capacity, grainSize, descriptorOffset,
# descriptorSize, numGTEsPerGT, rgdOffset, gdOffset, overHead, uncleanShutdown, the four
# newline-detection characters and compressAlgorithm; padded to one sector.
SPARSE_HEADER = struct.Struct("<4sIIQQQQIQQQB4sH")


class SparseHeader(NamedTuple):
    """The sparse extent header's fields by name, read once for every rule that needs them."""

    magic: bytes
    version: int
    flags: int
    capacity: int  # in sectors
    grain_sectors: int
    descriptor_offset: int
    descriptor_size: int
    table_entries: int
    redundant_directory: int
    directory: int
    overhead: int
    unclean_shutdown: int
    newline_characters: bytes
    algorithm: int


def sparse_header(header: bytes) -> SparseHeader | None:
    """The header's fields, or None when `header` holds no sparse vmdk header."""
    if len(header) < SPARSE_HEADER.size or not header.startswith(MAGIC):
        return None
    return SparseHeader._make(SPARSE_HEADER.unpack_from(header))


GRAIN_MARKER = struct.Struct("<QI")
LARGEST_GRAIN_SECTORS = 2048  # a grain above 1 MiB is refused: one grain is held in memory
MAX_FRAMED_BYTES = 8 * 1024 * 1024  # of a grain table or directory: 64 TiB of grains
_FRAMED_PIECE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Read:
    """The next `length` bytes, sent back; fewer (the rest) when the stream ends first."""

    length: int


@dataclass(frozen=True)
class Skip:
    """Pass over the next `length` bytes; sent back whether the stream held them."""

    length: int


@dataclass(frozen=True)
class Grain:
    """A grain's bytes at `start` in the disk (the last one cut at the disk's end), its marker
    at byte `record` of the stream."""

    start: int
    data: bytes
    record: int


@dataclass(frozen=True)
class Framed:
    """Bytes from `offset` of what a grain table or grain directory marker (`kind`) at byte
    `record` frames: its first MAX_FRAMED_BYTES at most, in pieces."""

    kind: int
    record: int
    offset: int
    data: bytes


@dataclass(frozen=True)
class Footer:
    """A footer placing the grain directory at `directory_sector`."""

    directory_sector: int


@dataclass(frozen=True)
class Layout:
    """What a streamOptimized header says of its disk: its grain directory's sector (None:
    a footer at the end says) and the entries of a grain table."""

    capacity_bytes: int
    grain_bytes: int
    overhead: int
    directory_sector: int | None
    table_entries: int

    @property
    def directory_at_end(self) -> bool:
        return self.directory_sector is None


Event = Read | Skip | Grain | Framed | Footer
# Returns the disk's capacity in bytes once the stream ended as a whole one, else the failure.
# Its first event after the header is the header's Layout.
Reading = Generator[Event | Layout, bytes | bool | None, Failure[ProviderError] | int]


def is_stream_optimized(header: bytes) -> bool:
    """A sparse VMDK header whose grains are compressed and carry markers."""
    read = sparse_header(header)
    return read is not None and read.flags & (FLAG_COMPRESSED | FLAG_MARKERS) == (
        FLAG_COMPRESSED | FLAG_MARKERS
    )


def sparse_header_problem(header: bytes) -> str | None:
    """What qemu reads otherwise than pyrigaud, or cannot read, in a sparse VMDK header, or
    None. qemu takes the grains as compressed by the compression field and as framed by
    markers by the flag, so deflated grains without the markers flag are inflated from their
    marker (and fail), where pyrigaud would read them as a stream or as raw grains; it takes
    an unknown compression for none (no tool writes one); and it
    reads the grain directory, and the redundant one the flags name, wherever their offsets
    say, failing at an offset past what it can address (a footer's directory aside: its
    header says GD_AT_END)."""
    read = sparse_header(header)
    if read is None:
        return None
    flags, redundant_directory, algorithm = read.flags, read.redundant_directory, read.algorithm
    directory = read.directory
    if algorithm not in (COMPRESS_NONE, COMPRESS_DEFLATE):
        return (
            f"the vmdk's grains use an unknown compression ({algorithm}; qemu reads them as "
            "not compressed)"
        )
    if algorithm == COMPRESS_DEFLATE and not is_stream_optimized(header):
        return (
            f"the vmdk's grains are deflated but its flags ({flags:#x}) do not say they are "
            "compressed and framed by markers (qemu reads them another way)"
        )
    if LARGEST_SECTOR <= directory != GD_AT_END:
        return f"the vmdk's grain directory lies past what qemu can read (sector {directory})"
    if flags & FLAG_REDUNDANT_DIRECTORY and redundant_directory >= LARGEST_SECTOR:
        return (
            "the vmdk's redundant grain directory lies past what qemu can read "
            f"(sector {redundant_directory})"
        )
    return None


def read_grains(field: str) -> Reading:
    """The reading of one stream (see the module's docstring); refusals name `field`."""
    header = yield Read(SECTOR_BYTES)
    assert isinstance(header, bytes)
    match _layout(header, field):
        case Failure() as failed:
            return failed
        case Success(Layout() as layout):
            yield layout
    skipped = yield Skip((layout.overhead - 1) * SECTOR_BYTES)
    if not skipped:
        return _invalid(field, "the vmdk ends inside its header")
    position = layout.overhead * SECTOR_BYTES  # the stream's next byte
    next_free = 0  # the first byte of the disk a following grain may start at
    while True:
        record = position
        marker = yield Read(GRAIN_MARKER.size)
        assert isinstance(marker, bytes)
        if len(marker) < GRAIN_MARKER.size:
            if layout.directory_at_end or marker.strip(b"\0"):
                return _invalid(field, "the vmdk ends before its end-of-stream marker")
            return layout.capacity_bytes
        lba, size = GRAIN_MARKER.unpack(marker)
        if size == 0:
            match (yield from _metadata(lba, header, record, field)):
                case Failure() as failed:
                    return failed
                case True:
                    return layout.capacity_bytes
            position = record + SECTOR_BYTES + lba * SECTOR_BYTES
            continue
        start = lba * SECTOR_BYTES
        problem = _grain_problem(layout, start, next_free, size)
        if problem:
            return _invalid(field, problem)
        compressed = yield Read(size)
        assert isinstance(compressed, bytes)
        padded = yield Skip(-(GRAIN_MARKER.size + size) % SECTOR_BYTES)
        if len(compressed) < size or not padded:
            return _invalid(field, "the vmdk ends inside a grain")
        match _inflated(compressed, layout, start, field):
            case Failure() as failed:
                return failed
            case Success(data):
                yield Grain(start, data, record)
        next_free = start + layout.grain_bytes
        position = record + GRAIN_MARKER.size + size + -(GRAIN_MARKER.size + size) % SECTOR_BYTES


def _layout(header: bytes, field: str) -> Result[Layout, ProviderError]:
    read = sparse_header(header)
    if read is None or not is_stream_optimized(header):
        return _invalid(field, "not a streamOptimized vmdk (no sparse header with grain markers)")
    capacity, grain_sectors, table_entries = read.capacity, read.grain_sectors, read.table_entries
    directory, overhead, algorithm = read.directory, read.overhead, read.algorithm
    if algorithm != COMPRESS_DEFLATE:
        return _invalid(field, f"the vmdk's grains use compression {algorithm}, not deflate")
    if not 1 <= grain_sectors <= LARGEST_GRAIN_SECTORS:
        return _invalid(field, f"the vmdk's grain size of {grain_sectors} sectors is unsupported")
    if overhead < 1:
        return _invalid(field, "the vmdk ends inside its header")
    if not 1 <= table_entries <= MAX_TABLE_ENTRIES:
        return _invalid(
            field, f"the vmdk's grain tables have {table_entries} entries; qemu reads 1 to 512"
        )
    return Success(
        Layout(
            capacity * SECTOR_BYTES,
            grain_sectors * SECTOR_BYTES,
            overhead,
            directory_sector=None if directory == GD_AT_END else directory,
            table_entries=table_entries,
        )
    )


def _metadata(
    sectors: int, header: bytes, record: int, field: str
) -> Generator[Event, bytes | bool | None, Failure[ProviderError] | bool]:
    """The rest of a metadata marker (its type) and the sectors it heads: whether it is the
    end of the stream, or the failure."""
    kind = yield Read(SECTOR_BYTES - GRAIN_MARKER.size)
    assert isinstance(kind, bytes)
    if len(kind) < SECTOR_BYTES - GRAIN_MARKER.size:
        return _invalid(field, "the vmdk ends inside a marker")
    (marker_type,) = struct.unpack_from("<I", kind)
    if marker_type == MARKER_EOS:
        return True
    if marker_type not in (MARKER_GT, MARKER_GD, MARKER_FOOTER):
        return _invalid(field, f"the vmdk has a marker of unknown type {marker_type}")
    if marker_type == MARKER_FOOTER and sectors == 1:
        footer = yield Read(SECTOR_BYTES)
        assert isinstance(footer, bytes)
        problem = _footer_problem(header, footer)
        if problem:
            return _invalid(field, problem)
        if len(footer) == SECTOR_BYTES:
            yield Footer(SPARSE_HEADER.unpack_from(footer)[9])
        return False
    framed = min(sectors * SECTOR_BYTES, MAX_FRAMED_BYTES)
    if marker_type in (MARKER_GT, MARKER_GD):
        offset = record + SECTOR_BYTES
        while offset < record + SECTOR_BYTES + framed:
            piece = yield Read(min(_FRAMED_PIECE_BYTES, record + SECTOR_BYTES + framed - offset))
            assert isinstance(piece, bytes)
            yield Framed(marker_type, record, offset, piece)
            if not piece:
                return _invalid(field, "the vmdk ends inside its metadata")
            offset += len(piece)
        sectors_left = sectors * SECTOR_BYTES - framed
    else:
        sectors_left = sectors * SECTOR_BYTES
    skipped = yield Skip(sectors_left)
    if not skipped:
        return _invalid(field, "the vmdk ends inside its metadata")
    return False


# The header's fields a footer must repeat (qemu reads the footer's in place of the header's
# when the header places the grain directory at the end): their places in SPARSE_HEADER.
_REPEATED_FIELDS = {
    "flags": 2,
    "capacity": 3,
    "grain size": 4,
    "grain table size": 7,
    "overhead": 10,
    "compression": 13,
}


def _footer_problem(header: bytes, footer: bytes) -> str | None:
    """A footer whose header qemu would read otherwise than the leading one (only when the
    leading one places the grain directory at the end: qemu reads no footer otherwise)."""
    if SPARSE_HEADER.unpack_from(header)[9] != GD_AT_END:
        return None
    if len(footer) < SPARSE_HEADER.size or not footer.startswith(MAGIC):
        return "the vmdk's footer is not a sparse header (qemu refuses it)"
    leading, repeated = SPARSE_HEADER.unpack_from(header), SPARSE_HEADER.unpack_from(footer)
    for name, place in _REPEATED_FIELDS.items():
        if leading[place] != repeated[place]:
            return (
                f"the vmdk's footer says another {name} ({repeated[place]}) than its header "
                f"({leading[place]}); qemu reads the footer's"
            )
    if repeated[9] == GD_AT_END:
        return "the vmdk's footer does not place its grain directory (qemu refuses it)"
    return None


def _grain_problem(layout: Layout, start: int, next_free: int, size: int) -> str | None:
    """What the export's sequential reading or qemu's reading of a grain refuses in its
    marker: a grain out of order, off a grain's start or past the disk, more bytes than qemu
    reads for a grain."""
    sector = start // SECTOR_BYTES
    if start < next_free:
        return (
            f"the vmdk's grains are not in increasing order (sector {sector} comes after "
            f"sector {(next_free - layout.grain_bytes) // SECTOR_BYTES}); a stream must be "
            "sequential"
        )
    if start >= layout.capacity_bytes:
        return f"the vmdk has a grain at sector {sector}, beyond its capacity"
    if start % layout.grain_bytes:
        return f"the vmdk has a grain at sector {sector}, which does not start a grain"
    if size > 2 * layout.grain_bytes:
        return (
            f"a vmdk grain has {size} compressed bytes, more than qemu reads for a grain of "
            f"{layout.grain_bytes} (twice as many)"
        )
    return None


def _inflated(
    compressed: bytes, layout: Layout, start: int, field: str
) -> Result[bytes, ProviderError]:
    """One grain's bytes, as qemu inflates them: a whole zlib stream of one grain, the last
    one of at least what is left of the disk; a grain inflating past its size is refused
    before it is held."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(compressed, layout.grain_bytes)
    except zlib.error as error:
        return _invalid(field, f"a vmdk grain does not inflate ({error})")
    if inflater.unconsumed_tail and not inflater.eof:
        return _invalid(field, "a vmdk grain inflates to more than its grain size")
    if not inflater.eof:
        return _invalid(field, "a vmdk grain's deflate stream is cut short (qemu fails the read)")
    wanted = min(layout.grain_bytes, layout.capacity_bytes - start)
    if len(data) < wanted:
        return _invalid(
            field,
            f"a vmdk grain inflates to {len(data)} bytes, less than the {wanted} of its grain "
            "(qemu fails the read)",
        )
    return Success(data[:wanted])


def _invalid(field: str, problem: str) -> Failure[ProviderError]:
    return Failure(ProviderError.invalid_spec(field, problem))


class StreamOptimizedCheck:
    """A streamOptimized vmdk's bytes, pushed as they stream past (`feed`), read by
    `read_grains`, its grain tables held against its grain markers (`TableAgreement`);
    `refusal` once every byte was fed. At most one grain's bytes, one fed chunk and the grain
    directory are held."""

    def __init__(self, field: str) -> None:
        self._field = field
        self._reading: Reading | None = read_grains(field)
        self._buffer = bytearray()
        self._fed = 0
        self._skipping = 0  # bytes still to pass over
        self._asked: Event | Layout = next(self._reading)
        self._outcome: Failure[ProviderError] | int | None = None
        self._tables: TableAgreement | None = None
        self._grain_bytes = 1

    def feed(self, chunk: bytes) -> None:
        start = self._fed
        self._fed += len(chunk)
        if self._reading is not None:
            self._buffer += chunk
            self._advance(ended=False)
        if self._tables is not None:
            self._tables.passing(start, chunk)

    def refusal(self) -> ProviderError | None:
        """Once every byte was fed: why the stream is not a whole one, or None."""
        if self._reading is not None:
            self._advance(ended=True)
        match self._outcome:
            case Failure(error):
                refused: ProviderError = error
                return refused
        problem = None if self._tables is None else self._tables.ended()
        return None if problem is None else ProviderError.invalid_spec(self._field, problem)

    def _advance(self, *, ended: bool) -> None:
        """Answer what the reading asks for as long as the held bytes (or the end) can."""
        while self._reading is not None:
            answer: bytes | bool | None = None
            match self._asked:
                case Skip(length):
                    taken = min(len(self._buffer), length - self._skipping)
                    del self._buffer[:taken]
                    self._skipping += taken
                    if self._skipping < length and not ended:
                        return
                    answer = self._skipping == length
                    self._skipping = 0
                case Read(length):
                    if len(self._buffer) < length and not ended:
                        return
                    answer = bytes(self._buffer[:length])
                    del self._buffer[:length]
                case event:
                    self._seen(event)
            self._send(answer)

    def _seen(self, event: Grain | Framed | Footer | Layout) -> None:
        """What the reading found, for the grain tables' agreement with the markers."""
        match event:
            case Layout() as layout:
                self._grain_bytes = layout.grain_bytes
                grains = -(-layout.capacity_bytes // layout.grain_bytes)
                self._tables = TableAgreement(grains, layout.table_entries, layout.directory_sector)
            case Grain(start, _, record) if self._tables is not None:
                self._tables.grain(start // self._grain_bytes, record // SECTOR_BYTES)
            case Framed(kind, record, offset, data) if self._tables is not None:
                self._tables.framed(kind, record, offset, data)
            case Footer(directory_sector) if self._tables is not None:
                self._tables.footer(directory_sector)

    def _send(self, answer: bytes | bool | None) -> None:
        assert self._reading is not None
        try:
            self._asked = self._reading.send(answer)
        except StopIteration as stop:
            self._outcome = stop.value
            self._reading = None
            self._buffer = bytearray()
