"""streamOptimized VMDK, the only disk format vCenter's NFC leases speak, encoded and decoded
sequentially: a sparse-extent header, then one marker and deflated grain per non-zero grain,
grain tables after their grains, the grain directory, a footer and an end-of-stream marker.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import struct
import zlib
from collections.abc import Iterable, Iterator

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.blocks import (
    MAX_CHUNK_BYTES,
    SECTOR_BYTES,
    ChunkReader,
    nonzero_block_results,
    round_up,
    zero_chunks,
)
from pyrigaud.adapters.disk_images.stream_optimized_grains import (
    COMPRESS_DEFLATE,
    FLAG_COMPRESSED,
    FLAG_MARKERS,
    GD_AT_END,
    GRAIN_MARKER,
    MAGIC,
    MARKER_EOS,
    MARKER_FOOTER,
    MARKER_GD,
    MARKER_GT,
    SPARSE_HEADER,
    Grain,
    Read,
    Skip,
    read_grains,
    sparse_header,
)
from pyrigaud.domain import fields
from pyrigaud.domain.chunks import Chunks, successes
from pyrigaud.domain.errors import ProviderError

GRAIN_BYTES = 65536
GRAIN_SECTORS = GRAIN_BYTES // SECTOR_BYTES
VERSION = 3
FLAG_NEWLINE_DETECT = 1 << 0
STREAM_FLAGS = FLAG_NEWLINE_DETECT | FLAG_COMPRESSED | FLAG_MARKERS  # what VMware writes
ENTRIES_PER_TABLE = 512  # grain table entries: one table maps 32 MiB
TABLE_SECTORS = ENTRIES_PER_TABLE * 4 // SECTOR_BYTES
OVERHEAD_SECTORS = 128  # header and descriptor, then the first grain at 64 KiB
DESCRIPTOR_OFFSET = 1
_MARKER = struct.Struct("<QII")
_FLUSH_BYTES = 1024 * 1024  # output is gathered to about this much (always <= 4 MiB) per chunk
# Deflate at level 1: a multi-GiB disk streams through one Python thread and the network, so
# compressing speed matters more than the few percent a higher level would save.
_LEVEL = 1
# Data deflate cannot shrink (already compressed or encrypted) goes in stored deflate blocks
# (level 0, ~1 GiB/s) instead of paying the full deflate (~40 MiB/s a core on such data) to
# save nothing: after a grain that did not shrink below 90%, each grain's first 4 KiB are
# deflated first, and the grain is stored when they come to more than 90% of their size.
_PROBE_BYTES = 4096
_WORTH_DEFLATING = 0.9
_THREADS = min(4, os.cpu_count() or 1)
_IN_FLIGHT = 16 * _THREADS  # grains handed to the deflate threads and not yet written


def encode_stream_optimized(raw_chunks: Iterable[bytes], capacity_bytes: int) -> Chunks[bytes]:
    """The raw disk (exactly `capacity_bytes`, any chunking) as a streamOptimized VMDK, never
    seeking back: the leading header says the grain directory is at the end, the footer says
    where. All-zero grains are left out; the last partial grain is padded with zeros. Raw
    chunks that end as they should not end the VMDK early, with their failure."""
    return Chunks(_encoded(raw_chunks, capacity_bytes), after=raw_chunks)


def _encoded(
    raw_chunks: Iterable[bytes], capacity_bytes: int
) -> Iterator[Result[bytes, ProviderError]]:
    sectors = round_up(capacity_bytes, SECTOR_BYTES) // SECTOR_BYTES
    out = _Output()
    descriptor = _descriptor(sectors)
    out.add(_header(sectors, len(descriptor) // SECTOR_BYTES, GD_AT_END))
    out.add(descriptor)
    out.pad_to(OVERHEAD_SECTORS * SECTOR_BYTES)
    tables = -(-sectors // (GRAIN_SECTORS * ENTRIES_PER_TABLE))
    directory = [0] * tables  # 4 bytes per 32 MiB of disk
    table: list[int] = []
    table_index = 0
    # The blocks' Results are read as they come, one frame shallower than through a Chunks:
    # a wrong length (or the raw chunks cut short) ends the VMDK with it, before its tables.
    blocks = nonzero_block_results(raw_chunks, capacity_bytes, GRAIN_BYTES)
    for deflated in _deflated_grains(blocks):
        match deflated:
            case Failure() as failed:
                yield failed
                return
            case Success((int() as grain, bytes() as compressed)):
                pass
        while grain // ENTRIES_PER_TABLE > table_index:
            directory[table_index] = _write_table(out, table)
            table, table_index = [], table_index + 1
        table.extend([0] * (grain % ENTRIES_PER_TABLE - len(table)))
        table.append(out.sector())
        out.add(GRAIN_MARKER.pack(grain * GRAIN_SECTORS, len(compressed)))
        out.add(compressed)
        out.pad_to_sector()
        yield from successes(out.flushed())
    if tables:
        directory[table_index] = _write_table(out, table)
    directory_bytes = struct.pack(f"<{tables}I", *directory)
    out.add(_marker(round_up(len(directory_bytes), SECTOR_BYTES) // SECTOR_BYTES, MARKER_GD))
    directory_sector = out.sector()
    out.add(directory_bytes)
    out.pad_to_sector()
    out.add(_marker(1, MARKER_FOOTER))
    out.add(_header(sectors, len(descriptor) // SECTOR_BYTES, directory_sector))
    out.add(_marker(0, MARKER_EOS))
    yield from successes(out.flushed(final=True))


def _deflated_grains(
    blocks: Iterable[Result[tuple[int, bytes], ProviderError]],
) -> Iterator[Result[tuple[int, bytes], ProviderError]]:
    """(grain, its deflated bytes) for every non-zero grain, in order, then the blocks'
    failure if one ended them. Deflate is the cost of an export and zlib lets go of the GIL,
    so grains are deflated on a few threads; at most _IN_FLIGHT grains (a few MiB) wait at
    once. Once a grain comes back at more than 90% of its size, the following ones are probed
    before they are deflated, until one shrinks."""
    pending: collections.deque[tuple[int, concurrent.futures.Future[bytes]]] = collections.deque()
    probe = False
    ended: Result[None, ProviderError] = Success(None)

    def written() -> Result[tuple[int, bytes], ProviderError]:
        nonlocal probe
        grain, future = pending.popleft()
        deflated = future.result()
        probe = len(deflated) > _WORTH_DEFLATING * GRAIN_BYTES
        return Success((grain, deflated))

    with concurrent.futures.ThreadPoolExecutor(_THREADS, "vmdk-deflate") as pool:
        for block in blocks:
            match block:
                case Failure() as failed:
                    ended = failed
                    break
                case Success((int() as grain, bytes() as data)):
                    pending.append((grain, pool.submit(_deflate, data, probe)))
            if len(pending) >= _IN_FLIGHT:
                yield written()
        while pending:
            yield written()
    match ended:
        case Failure() as failed:
            yield failed


def _deflate(data: bytes, probe: bool) -> bytes:
    """The grain deflated at level 1; or, when `probe` is set and its first 4 KiB deflate to
    more than 90% of their size, stored. One deflate stream: the probe's output, flushed to a
    byte boundary, starts the grain's. Through compress objects: unlike zlib.compress, they
    let go of the GIL while they work, so the deflate threads run at once."""
    deflater = zlib.compressobj(_LEVEL)
    if not probe:
        return deflater.compress(data) + deflater.flush()
    start = deflater.compress(data[:_PROBE_BYTES]) + deflater.flush(zlib.Z_SYNC_FLUSH)
    if len(start) > _WORTH_DEFLATING * min(len(data), _PROBE_BYTES):
        storer = zlib.compressobj(0)
        return storer.compress(data) + storer.flush()
    return start + deflater.compress(memoryview(data)[_PROBE_BYTES:]) + deflater.flush()


def decode_stream_optimized(
    chunks: Iterable[bytes], *, field: str = fields.SOURCE_URL
) -> Chunks[bytes]:
    """The raw disk (exactly its capacity, chunks <= 4 MiB) of a streamOptimized VMDK in any
    chunking, read sequentially by `read_grains`' rules (the image judge's): grains in
    increasing order; grain tables, the grain directory and the footer passed over; the
    end-of-stream marker ends the disk. A VMDK that breaks them ends the disk early,
    INVALID_SPEC naming `field`."""
    return Chunks(_decoded(chunks, field), after=chunks)


def _decoded(chunks: Iterable[bytes], field: str) -> Iterator[Result[bytes, ProviderError]]:
    reader = ChunkReader(chunks)
    reading = read_grains(field)
    emitted = 0  # bytes of the disk yielded so far
    asked = next(reading)
    while True:
        answer: bytes | bool | None = None
        match asked:
            case Read(length):
                answer = reader.read(length)
            case Skip(length):
                answer = reader.skip(length)
            case Grain(start, data):
                yield from successes(zero_chunks(start - emitted))
                yield Success(data)
                emitted = start + len(data)
        try:
            asked = reading.send(answer)
        except StopIteration as stop:
            ended: Failure[ProviderError] | int = stop.value
            break
    match ended:
        case Failure() as failed:
            yield failed
        case int(capacity_bytes):
            yield from successes(zero_chunks(capacity_bytes - emitted))


def stream_optimized_capacity(
    header: bytes, *, field: str = fields.SOURCE_URL
) -> Result[int, ProviderError]:
    """The disk's capacity in bytes, from a sparse VMDK's first sector."""
    read = sparse_header(header)
    if read is None:
        return _invalid(field, "not a sparse vmdk")
    return Success(read.capacity * SECTOR_BYTES)


def _header(sectors: int, descriptor_sectors: int, directory_sector: int) -> bytes:
    return SPARSE_HEADER.pack(
        MAGIC,
        VERSION,
        STREAM_FLAGS,
        sectors,
        GRAIN_SECTORS,
        DESCRIPTOR_OFFSET,
        descriptor_sectors,
        ENTRIES_PER_TABLE,
        0,
        directory_sector,
        OVERHEAD_SECTORS,
        0,
        b"\n \r\n",
        COMPRESS_DEFLATE,
    ).ljust(SECTOR_BYTES, b"\0")


def _descriptor(sectors: int) -> bytes:
    """The embedded descriptor VMware expects: one sparse extent, an LSI Logic disk."""
    cylinders = min(sectors // (255 * 63), 65535)
    text = (
        "# Disk DescriptorFile\n"
        "version=1\n"
        f"CID={int.from_bytes(os.urandom(4)):08x}\n"
        "parentCID=ffffffff\n"
        'createType="streamOptimized"\n'
        "\n"
        "# Extent description\n"
        f'RW {sectors} SPARSE "x.vmdk"\n'
        "\n"
        "# The Disk Data Base\n"
        "#DDB\n"
        "\n"
        'ddb.adapterType = "lsilogic"\n'
        f'ddb.geometry.cylinders = "{cylinders}"\n'
        'ddb.geometry.heads = "255"\n'
        'ddb.geometry.sectors = "63"\n'
        'ddb.virtualHWVersion = "4"\n'
    ).encode()
    return text.ljust(round_up(len(text), SECTOR_BYTES), b"\0")


def _marker(sectors: int, kind: int) -> bytes:
    return _MARKER.pack(sectors, 0, kind).ljust(SECTOR_BYTES, b"\0")


def _write_table(out: _Output, table: list[int]) -> int:
    """Write one grain table after its grains; its sector for the directory (0: none needed)."""
    if not table:
        return 0
    out.add(_marker(TABLE_SECTORS, MARKER_GT))
    sector = out.sector()
    out.add(struct.pack(f"<{ENTRIES_PER_TABLE}I", *table, *[0] * (ENTRIES_PER_TABLE - len(table))))
    return sector


def _invalid(field: str, problem: str) -> Failure[ProviderError]:
    return Failure(ProviderError.invalid_spec(field, problem))


class _Output:
    """The encoded bytes, gathered into chunks of about a MiB, and the sector they reach."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._written = 0

    def add(self, data: bytes) -> None:
        self._pending += data

    def sector(self) -> int:
        return (self._written + len(self._pending)) // SECTOR_BYTES

    def pad_to_sector(self) -> None:
        self._pending += bytes(-len(self._pending) % SECTOR_BYTES)

    def pad_to(self, offset: int) -> None:
        self._pending += bytes(offset - self._written - len(self._pending))

    def flushed(self, *, final: bool = False) -> Iterator[bytes]:
        """The gathered bytes once there is enough of them (all of them when `final`)."""
        if len(self._pending) < _FLUSH_BYTES and not final:
            return
        for start in range(0, len(self._pending), MAX_CHUNK_BYTES):
            yield bytes(self._pending[start : start + MAX_CHUNK_BYTES])
        self._written += len(self._pending)
        self._pending.clear()
