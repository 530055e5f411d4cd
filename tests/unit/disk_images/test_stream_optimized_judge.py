"""The judge reads a streamOptimized vmdk whole as it streams, by the rules the export's decoder
reads it by and qemu's reading of a grain: what it accepts, qemu reads and the export decodes
to the same disk; what qemu refuses, it refuses; and where it refuses what qemu would read
(a grain qemu places by its tables but no sequential reader can place), it says why."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from pyrigaud.adapters.disk_images.stream_optimized import (
    decode_stream_optimized,
    encode_stream_optimized,
)
from pyrigaud.domain.errors import ErrorKind

from support import error_of, ok
from support.disk_image import MIB, file_chunks, sparse_disk
from support.image_corpus import HOSTILE, hostile_image, oracle_raw, valid_image
from support.judging import judged

STREAMS = ("vmdk-stream-optimized", "vmdk-stream-optimized-without-end-of-stream")
HOSTILE_STREAMS = sorted(name for name, (base, _) in HOSTILE.items() if base == STREAMS[0])
# What qemu reads though the judge refuses it: qemu places grains by the grain tables and
# inflates any grain as deflate, whatever its marker's sector or the header's algorithm say.
# The tables bent: qemu reads a disk, another than the markers say.
QEMU_READS = {
    "vmdk-grains-not-deflate",
    "vmdk-grain-beyond-capacity",
    "vmdk-grain-tables-swap-two-grains",
    "vmdk-grain-table-drops-a-grain",
}


# Bent in the tables only: the markers the export reads are whole, the judge refuses what
# qemu would read otherwise.
TABLES_ONLY = {"vmdk-grain-tables-swap-two-grains", "vmdk-grain-table-drops-a-grain"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def qemu_reads(path: Path) -> bool:
    converted = subprocess.run(
        ["qemu-img", "convert", "-f", "vmdk", "-O", "raw", str(path), str(path) + ".raw"],
        check=False,
        capture_output=True,
    )
    return converted.returncode == 0


@pytest.mark.parametrize("chunk", [511, 65536, 4 * MIB])
@pytest.mark.parametrize("name", STREAMS)
def test_a_stream_qemu_reads_is_taken_and_decodes_to_what_qemu_reads(
    corpus: Path, name: str, chunk: int
) -> None:
    image = valid_image(name, corpus)
    assert qemu_reads(image.path)
    assert ok(judged(image.path, chunk=chunk)).stream_optimized_vmdk
    decoded = decode_stream_optimized(file_chunks(image.path, chunk))
    assert ok(decoded.consumed_by(b"".join)) == oracle_raw(image, corpus)


@pytest.mark.parametrize("name", HOSTILE_STREAMS)
def test_a_hostile_stream_is_refused_by_name(corpus: Path, name: str) -> None:
    image = hostile_image(name, corpus)
    assert qemu_reads(image.path) is (name in QEMU_READS)
    refused = error_of(judged(image.path))
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert "source_url" in refused.message
    if name not in TABLES_ONLY:
        # The export's decoder, which reads the markers, refuses it alike.
        decoded = decode_stream_optimized(file_chunks(image.path))
        assert error_of(decoded.consumed_by(list)).kind is ErrorKind.INVALID_SPEC


def test_a_stream_whose_directory_is_at_its_end_needs_its_end_of_stream_marker(
    tmp_path: Path,
) -> None:
    """VMware's layout (and the export's): the header says the grain directory is at the end,
    so qemu reads the footer before the end-of-stream marker, and refuses the image without
    it; the judge and the decoder refuse it too, all-zero disk or not."""
    whole = b"".join(encode_stream_optimized([bytes(3 * MIB)], 3 * MIB))
    image = tmp_path / "without-end-of-stream.vmdk"
    image.write_bytes(whole[:-512])
    assert not qemu_reads(image)
    assert error_of(judged(image)).kind is ErrorKind.INVALID_SPEC
    decoded = decode_stream_optimized([whole[:-512]])
    assert "end-of-stream marker" in error_of(decoded.consumed_by(list)).message


@pytest.mark.parametrize(
    ("name", "place", "value"),
    [("capacity", 12, 2 * 6144), ("grain size", 20, 256), ("overhead", 64, 256)],
)
def test_a_footer_qemu_reads_otherwise_than_the_header_is_refused(
    tmp_path: Path, name: str, place: int, value: int
) -> None:
    """The header places the grain directory at the end: qemu reads the footer's fields in
    place of the header's, the export reads the header's. A footer that says otherwise is
    refused, naming the field; qemu reads such an image differently (another size) or not at
    all."""
    disk = bytes(range(256)) * 256 + bytes(3 * MIB - 65536)
    whole = bytearray(b"".join(encode_stream_optimized([disk], len(disk))))
    footer = len(whole) - 1024
    struct.pack_into("<Q", whole, footer + place, value)
    image = tmp_path / "footer.vmdk"
    image.write_bytes(bytes(whole))
    assert not qemu_reads(image) or qemu_virtual_size(image) != len(disk)
    refused = error_of(judged(image))
    assert f"footer says another {name}" in refused.message


def test_a_footer_naming_another_grain_directory_is_refused(tmp_path: Path) -> None:
    """VMware's layout: the footer names where qemu reads the grain directory; one that names
    anything but the directory its marker framed has qemu read other tables than the
    markers say (here qemu reads the disk as zeros)."""
    disk = bytes(range(256)) * 256 + bytes(3 * MIB - 65536)
    whole = bytearray(b"".join(encode_stream_optimized([disk], len(disk))))
    struct.pack_into("<Q", whole, len(whole) - 1024 + 56, 3)  # the footer's gdOffset
    image = tmp_path / "footer.vmdk"
    image.write_bytes(bytes(whole))
    assert qemu_reads(image)
    assert (tmp_path / "footer.vmdk.raw").read_bytes() != disk
    assert "where no grain directory marker put one" in error_of(judged(image)).message


def qemu_virtual_size(path: Path) -> int:
    info = subprocess.run(
        ["qemu-img", "info", "--output=json", "-f", "vmdk", str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(json.loads(info)["virtual-size"])


@pytest.mark.parametrize("chunk", [511, 65536, 4 * MIB])
def test_the_exports_own_layout_is_taken(tmp_path: Path, chunk: int) -> None:
    """VMware's layout, as the export encodes it (grain tables after their grains, the
    directory and a footer naming it last): its tables agree with its markers."""
    disk = sparse_disk(40 * MIB + 1536, seed=3)
    image = tmp_path / "encoded.vmdk"
    image.write_bytes(b"".join(encode_stream_optimized([disk], len(disk))))
    assert qemu_reads(image)
    assert (tmp_path / "encoded.vmdk.raw").read_bytes() == disk
    assert ok(judged(image, chunk=chunk)).stream_optimized_vmdk
