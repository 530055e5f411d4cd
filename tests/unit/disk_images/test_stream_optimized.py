"""streamOptimized VMDK against the real qemu-img: what we encode it reads back exactly, and
what it makes we decode exactly; malformed streams are refused, not guessed at."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest
from returns.result import Failure, Success

from pyrigaud.adapters.disk_images.blocks import MAX_CHUNK_BYTES, round_up
from pyrigaud.adapters.disk_images.stream_optimized import (
    GRAIN_BYTES,
    decode_stream_optimized,
    encode_stream_optimized,
    stream_optimized_capacity,
)
from pyrigaud.adapters.disk_images.stream_optimized_grains import GD_AT_END, is_stream_optimized
from pyrigaud.domain.chunks import Chunks
from pyrigaud.domain.errors import ErrorKind, ProviderError

from support.disk_image import MIB, chunked, qemu_img, qemu_info, sparse_disk, to_raw, write_file

HEADER = struct.Struct("<4sIIQQQQIQQQB4sH")


def sector_padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def encode_to(path: Path, disk: bytes, chunk: int) -> list[int]:
    return write_file(path, encode_stream_optimized(chunked(disk, chunk), len(disk)))


@pytest.mark.parametrize(
    ("size", "seed"),
    [
        (3 * MIB + 12345, 1),
        (5 * MIB, 2),
        (32 * MIB + GRAIN_BYTES * 3 + 512, 3),
        (GRAIN_BYTES - 1, 4),
    ],
)
def test_qemu_reads_back_what_is_encoded(tmp_path: Path, size: int, seed: int) -> None:
    disk = sparse_disk(size, seed)
    image = tmp_path / "disk.vmdk"
    sizes = encode_to(image, disk, 1_000_003)
    assert max(sizes) <= MAX_CHUNK_BYTES
    info = qemu_info(image)
    assert info["format"] == "vmdk"
    assert info["format-specific"]["data"]["create-type"] == "streamOptimized"
    assert info["virtual-size"] == len(sector_padded(disk))
    assert to_raw(image, tmp_path / "back.raw") == sector_padded(disk)


@pytest.mark.slow
def test_a_64_mib_disk_round_trips_through_qemu(tmp_path: Path) -> None:
    disk = sparse_disk(64 * MIB + 4096, 5)
    image = tmp_path / "big.vmdk"
    assert max(encode_to(image, disk, 5 * MIB)) <= MAX_CHUNK_BYTES
    assert to_raw(image, tmp_path / "back.raw") == disk
    decoded = list(decode_stream_optimized(chunked(image.read_bytes(), 5 * MIB)))
    assert max(map(len, decoded)) <= MAX_CHUNK_BYTES
    assert b"".join(decoded) == disk


def test_layout_is_vmwares_sequential_one(tmp_path: Path) -> None:
    """Leading header says the directory is at the end; the footer says where; EOS last."""
    disk = sparse_disk(40 * MIB, 6)
    stream = b"".join(encode_stream_optimized([disk], len(disk)))
    magic, version, flags, capacity, grain, _, _, per_table, _, gd, overhead, _, newlines, algo = (
        HEADER.unpack_from(stream)
    )
    assert (magic, version, flags, grain, per_table, overhead, newlines, algo) == (
        b"KDMV",
        3,
        0x30001,
        128,
        512,
        128,
        b"\n \r\n",
        1,
    )
    assert capacity * 512 == len(disk)
    assert gd == GD_AT_END
    descriptor = stream[512 : 128 * 512].rstrip(b"\0").decode()
    assert 'createType="streamOptimized"' in descriptor
    assert f'RW {len(disk) // 512} SPARSE "x.vmdk"' in descriptor
    assert 'ddb.adapterType = "lsilogic"' in descriptor
    assert 'ddb.virtualHWVersion = "4"' in descriptor
    assert struct.unpack_from("<QII", stream, len(stream) - 512) == (0, 0, 0)  # EOS
    assert struct.unpack_from("<QII", stream, len(stream) - 1536) == (1, 0, 3)  # footer marker
    footer_gd = HEADER.unpack_from(stream, len(stream) - 1024)[9]
    assert struct.unpack_from("<QII", stream, footer_gd * 512 - 512) == (1, 0, 2)  # GD marker
    directory = struct.unpack_from("<2I", stream, footer_gd * 512)
    for table in directory:  # a 40 MiB disk has two grain tables, each after its grains
        assert struct.unpack_from("<QII", stream, table * 512 - 512) == (4, 0, 1)
    entries = struct.unpack_from("<512I", stream, directory[0] * 512)
    grain, sector = next((grain, sector) for grain, sector in enumerate(entries) if sector)
    assert struct.unpack_from("<Q", stream, sector * 512) == (grain * 128,)  # its marker's LBA


def test_all_zero_disk_holds_no_grain(tmp_path: Path) -> None:
    size = 100 * MIB
    stream = b"".join(encode_stream_optimized(chunked(bytes(size), 4 * MIB), size))
    # Header and descriptor, then directory, footer and EOS, each with its marker.
    assert len(stream) == 128 * 512 + 5 * 512
    image = tmp_path / "zero.vmdk"
    image.write_bytes(stream)
    assert qemu_info(image)["virtual-size"] == size
    assert b"".join(decode_stream_optimized([stream])) == bytes(size)


@pytest.mark.parametrize("chunk", [1, 7, 5 * MIB])
def test_any_chunking_of_input_and_of_stream(chunk: int) -> None:
    disk = sparse_disk(300_000 if chunk < 512 else 6 * MIB + 100, 7)
    stream = b"".join(encode_stream_optimized(chunked(disk, chunk), len(disk)))
    decoded = list(decode_stream_optimized(chunked(stream, chunk)))
    assert max(map(len, decoded)) <= MAX_CHUNK_BYTES
    assert b"".join(decoded) == sector_padded(disk)


@pytest.mark.parametrize("chunk", [7, MIB])
def test_qemu_made_stream_decodes_as_qemu_reads_it(tmp_path: Path, chunk: int) -> None:
    source = tmp_path / "source.raw"
    source.write_bytes(sparse_disk(9 * MIB + 7 * 512, 8))
    image = tmp_path / "qemu.vmdk"
    qemu_img("convert", "-O", "vmdk", "-o", "subformat=streamOptimized", source, image)
    expected = to_raw(image, tmp_path / "expected.raw")
    header = image.read_bytes()[:512]
    assert is_stream_optimized(header)
    assert stream_optimized_capacity(header) == Success(len(expected))
    decoded = list(decode_stream_optimized(chunked(image.read_bytes(), chunk)))
    assert b"".join(decoded) == expected


def test_monolithic_sparse_is_not_a_stream(tmp_path: Path) -> None:
    image = tmp_path / "sparse.vmdk"
    qemu_img("create", "-f", "vmdk", image, "1M")
    header = image.read_bytes()[:512]
    assert not is_stream_optimized(header)
    assert stream_optimized_capacity(header) == Success(MIB)
    error = refusal(decode_stream_optimized([image.read_bytes()], field="image"))
    assert error.message.startswith("image: not a streamOptimized vmdk")


@pytest.mark.parametrize("given", [GRAIN_BYTES * 3 - 1, GRAIN_BYTES * 3 + 1])
def test_input_of_another_length_than_capacity_is_refused(given: int) -> None:
    error = refusal(encode_stream_optimized(chunked(b"\1" * given, 1000), GRAIN_BYTES * 3))
    assert error.kind is ErrorKind.FAILED_PRECONDITION
    assert "gave" in error.message


def refusal(stream: Chunks[bytes]) -> ProviderError:
    """What ended `stream` early (read to its end)."""
    match stream.consumed_by(list):
        case Failure(error):
            refused: ProviderError = error
            return refused
    pytest.fail("the stream ended as a whole one")


def grain_record(lba: int, data: bytes) -> bytes:
    compressed = zlib.compress(data)
    return sector_padded(struct.pack("<QI", lba, len(compressed)) + compressed)


def cut_short_grain_record(lba: int, data: bytes) -> bytes:
    """A grain whose zlib stream lacks its last 4 bytes (its checksum): it inflates to the
    whole grain, but its stream does not end."""
    compressed = zlib.compress(data)[:-4]
    return sector_padded(struct.pack("<QI", lba, len(compressed)) + compressed)


def stream_of(*records: bytes) -> bytes:
    """Our own leading header and descriptor for a 1 MiB disk, then the given records."""
    head = b"".join(encode_stream_optimized([bytes(MIB)], MIB))[: 128 * 512]
    return head + b"".join(records)


EOS = struct.pack("<QII", 0, 0, 0).ljust(512, b"\0")


def test_grains_out_of_order_are_refused() -> None:
    stream = stream_of(grain_record(128, b"\1" * GRAIN_BYTES), grain_record(0, b"\2"), EOS)
    error = refusal(decode_stream_optimized([stream]))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert "not in increasing order" in error.message


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ((grain_record(0, b"\1" * GRAIN_BYTES),), "ends before its end-of-stream marker"),
        ((grain_record(0, b"\1" * (GRAIN_BYTES + 1)), EOS), "more than its grain size"),
        ((grain_record(2048, b"\1"), EOS), "beyond its capacity"),
        ((struct.pack("<QII", 0, 0, 9).ljust(512, b"\0"),), "unknown type 9"),
        ((sector_padded(struct.pack("<QI", 0, 5) + b"nope!"), EOS), "does not inflate"),
        # qemu reads a grain whole: one short of its grain size (not the disk's last) fails.
        ((grain_record(0, b"\1" * 100), EOS), "less than the 65536 of its grain"),
        ((cut_short_grain_record(0, b"\1" * GRAIN_BYTES), EOS), "cut short"),
        ((grain_record(100, b"\1" * GRAIN_BYTES), EOS), "does not start a grain"),
    ],
)
def test_malformed_streams_are_refused(records: tuple[bytes, ...], problem: str) -> None:
    assert problem in refusal(decode_stream_optimized([stream_of(*records)])).message


def test_grains_after_gaps_decode_in_place() -> None:
    first = b"\7" * 100 + bytes(GRAIN_BYTES - 100)
    stream = stream_of(grain_record(256, first), grain_record(1920, b"\3" * GRAIN_BYTES), EOS)
    disk = b"".join(decode_stream_optimized([stream]))
    expected = bytearray(MIB)
    expected[256 * 512 : 256 * 512 + 100] = b"\7" * 100
    expected[1920 * 512 :] = b"\3" * GRAIN_BYTES
    assert disk == bytes(expected)


def grain_records(stream: bytes) -> dict[int, bytes]:
    """Each grain's deflated bytes by its first sector, walking the stream's markers."""
    records, offset = {}, 128 * 512
    while True:
        lba, size = struct.unpack_from("<QI", stream, offset)
        if size:
            records[lba] = stream[offset + 12 : offset + 12 + size]
            offset += round_up(12 + size, 512)
            continue
        if struct.unpack_from("<I", stream, offset + 12) == (0,):  # end of stream
            return records
        offset += 512 + lba * 512  # a table, directory or footer marker, then its sectors


def stored(data: bytes) -> bytes:
    storer = zlib.compressobj(0)
    return storer.compress(data) + storer.flush()


def test_data_deflate_cannot_shrink_is_stored_and_what_follows_deflated(tmp_path: Path) -> None:
    """Once grains stop shrinking (random data here, as compressed or encrypted data are),
    the following ones are stored rather than deflated for nothing, and compressible grains
    after them are deflated again; qemu-img reads it all back exactly."""
    chooser = random.Random(8)
    noise = [chooser.randbytes(GRAIN_BYTES) for _ in range(200)]
    text = [(b"grain %d of a text file\n" % index) * 3000 for index in range(100)]
    disk = b"".join(noise) + b"".join(grain[:GRAIN_BYTES] for grain in text)
    stream = b"".join(encode_stream_optimized(chunked(disk, 4 * MIB), len(disk)))
    records = grain_records(stream)
    assert sorted(records) == [index * 128 for index in range(300)]
    assert records[199 * 128] == stored(noise[199])
    assert all(len(records[index * 128]) < GRAIN_BYTES // 20 for index in range(200, 300))
    image = tmp_path / "mixed.vmdk"
    image.write_bytes(stream)
    assert to_raw(image, tmp_path / "back.raw") == disk
