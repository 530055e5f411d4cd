"""qcow2 against the real qemu-img: the images we write check clean and read back exactly,
the images it makes (v2, v3, compressed, zero clusters, odd cluster sizes) we read exactly,
and images naming other files or using features we do not read are refused."""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from pyrigaud.adapters.disk_images.blocks import MAX_CHUNK_BYTES
from pyrigaud.adapters.disk_images.qcow2 import qcow2_virtual_size, read_qcow2, write_qcow2
from pyrigaud.domain.errors import ErrorKind, ExpectedError

from disk_image_support import MIB, chunked, file_chunks, qemu_img, qemu_info, sparse_disk

GIB = 1024 * MIB


def write_image(path: Path, chunks: Iterable[bytes], capacity: int) -> int:
    with path.open("w+b") as file:
        return write_qcow2(chunks, capacity, file)


def check_clean(path: Path) -> None:
    done = subprocess.run(
        ["qemu-img", "check", "--output=json", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["check-errors"] == 0
    assert "leaks" not in report
    assert "corruptions" not in report


def read_all(path: Path, **field: str) -> bytes:
    with path.open("rb") as file:
        chunks = list(read_qcow2(file, **field))
    assert all(len(chunk) <= MAX_CHUNK_BYTES for chunk in chunks)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("size", "chunk"),
    [(3 * MIB + 12345, 1_000_003), (5 * MIB, 7), (64 * MIB + 512, 5 * MIB), (0, 4096)],
)
def test_qemu_checks_and_reads_back_what_is_written(tmp_path: Path, size: int, chunk: int) -> None:
    disk = sparse_disk(size if chunk > 7 else 400_000, size)
    image = tmp_path / "disk.qcow2"
    written = write_image(image, chunked(disk, chunk), len(disk))
    assert written == image.stat().st_size
    check_clean(image)
    info = qemu_info(image)
    assert info["format"] == "qcow2"
    assert info["format-specific"]["data"]["compat"] == "1.1"
    assert info["cluster-size"] == 65536
    padded = disk + bytes(-len(disk) % 512)
    assert info["virtual-size"] == len(padded)
    raw = tmp_path / "back.raw"
    qemu_img("convert", "-O", "raw", image, raw)
    assert raw.read_bytes() == padded
    assert read_all(image) == padded


def test_a_disk_past_several_l2_tables_keeps_zero_clusters_unallocated(tmp_path: Path) -> None:
    """1.25 GiB of mostly zeros with data across the first 512 MiB boundary and past the
    second: three L2 tables, and only the four data clusters allocated."""
    size = GIB + GIB // 4
    source = tmp_path / "source.raw"
    with source.open("wb") as file:
        file.truncate(size)
        for offset in (0, 512 * MIB - 100, GIB + 4096):
            file.seek(offset)
            file.write(b"\x5a" * 300)
    image = tmp_path / "disk.qcow2"
    written = write_image(image, file_chunks(source), size)
    check_clean(image)
    assert written < 16 * MIB
    qemu_img("compare", "-f", "raw", "-F", "qcow2", source, image)
    map_ = json.loads(qemu_img("map", "--output=json", image))
    assert sum(extent["length"] for extent in map_ if extent["data"]) == 4 * 65536


@pytest.mark.parametrize(
    "options",
    [
        ["-o", "compat=0.10"],
        ["-o", "compat=1.1"],
        ["-c"],
        ["-c", "-o", "compat=0.10,cluster_size=4096"],
        ["-o", "cluster_size=512"],
        ["-o", "cluster_size=2M"],
    ],
)
def test_qemu_made_images_read_as_qemu_reads_them(tmp_path: Path, options: list[str]) -> None:
    source = tmp_path / "source.raw"
    disk = sparse_disk(9 * MIB + 3 * 512, 11)
    source.write_bytes(disk)
    image = tmp_path / "qemu.qcow2"
    qemu_img("convert", "-O", "qcow2", *options, source, image)
    assert qcow2_virtual_size(image.read_bytes()[:512]) == len(disk)
    assert read_all(image) == disk


def test_zero_clusters_over_allocated_ones_read_as_zeros(tmp_path: Path) -> None:
    image = tmp_path / "zeros.qcow2"
    qemu_img("create", "-f", "qcow2", image, "4M")
    for command in ("write -P 0x11 0 4M", "write -z 1M 1M", "write -z -u 3M 64k"):
        subprocess.run(["qemu-io", "-c", command, str(image)], check=True, capture_output=True)
    expected = bytearray(b"\x11" * 4 * MIB)
    expected[MIB : 2 * MIB] = bytes(MIB)
    expected[3 * MIB : 3 * MIB + 65536] = bytes(65536)
    assert read_all(image) == bytes(expected)


def refused(image: Path) -> str:
    with pytest.raises(ExpectedError) as raised:
        read_all(image, field="image_url")
    assert raised.value.error.kind is ErrorKind.INVALID_SPEC
    assert raised.value.error.message.startswith("image_url: ")
    return raised.value.error.message


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["-b", "{dir}/base.qcow2", "-F", "qcow2"], "names a backing file"),
        (["-o", "data_file={dir}/data.raw"], "external file"),
        (["-o", "extended_l2=on"], "extended L2"),
        (["-o", "compression_type=zstd"], "zstd"),
        (
            [
                "--object",
                "secret,id=s0,data=test-only",
                "-o",
                "encrypt.format=luks,encrypt.key-secret=s0",
            ],
            "encrypted",
        ),
    ],
)
def test_images_qemu_makes_that_cannot_be_read_alone_are_refused(
    tmp_path: Path, options: list[str], problem: str
) -> None:
    qemu_img("create", "-f", "qcow2", tmp_path / "base.qcow2", "1M")
    image = tmp_path / "refused.qcow2"
    qemu_img("create", "-f", "qcow2", *(o.format(dir=tmp_path) for o in options), image, "1M")
    assert problem in refused(image)


@pytest.mark.parametrize(
    ("offset", "value", "problem"),
    [
        (72, struct.pack(">Q", 1 << 40), "unknown features (bits 0x10000000000)"),
        (72, struct.pack(">Q", 1 << 1), "marked corrupt"),
        (4, struct.pack(">I", 4), "version 4"),
        (20, struct.pack(">I", 30), "cluster size"),
    ],
)
def test_headers_it_does_not_read_are_refused(
    tmp_path: Path, offset: int, value: bytes, problem: str
) -> None:
    image = tmp_path / "patched.qcow2"
    qemu_img("create", "-f", "qcow2", image, "1M")
    data = bytearray(image.read_bytes())
    data[offset : offset + len(value)] = value
    image.write_bytes(data)
    assert problem in refused(image)


def test_input_shorter_than_capacity_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExpectedError, match="gave 131071 bytes") as raised:
        write_image(tmp_path / "short.qcow2", [b"\1" * 131071], 131072)
    assert raised.value.error.kind is ErrorKind.FAILED_PRECONDITION


def test_an_internal_snapshot_of_an_overlay_reads_as_qemu_reads_it(tmp_path: Path) -> None:
    """The state at a snapshot, with the clusters the overlay leaves to its backing read from
    the backing's raw disk in step (what libvirt's export of a snapshot does)."""
    base = tmp_path / "base.raw"
    base.write_bytes(sparse_disk(6 * MIB, 21))
    overlay = tmp_path / "overlay.qcow2"
    qemu_img("create", "-f", "qcow2", "-b", base, "-F", "raw", overlay, "8M")
    steps = ("write -P 0x22 1M 512k", "write -c -P 0x44 3M 64k")
    for command in steps:
        subprocess.run(["qemu-io", "-c", command, str(overlay)], check=True, capture_output=True)
    qemu_img("snapshot", "-c", "mig", overlay)
    for command in ("write -P 0x33 0 2M", "write -z 4M 1M"):  # after the snapshot: not in it
        subprocess.run(["qemu-io", "-c", command, str(overlay)], check=True, capture_output=True)
    expected = tmp_path / "expected.raw"
    qemu_img("convert", "-l", "snapshot.name=mig", "-O", "raw", overlay, expected)
    with overlay.open("rb") as file:
        got = b"".join(read_qcow2(file, snapshot="mig", backing=file_chunks(base, 1_000_003)))
    assert got == expected.read_bytes()
    with overlay.open("rb") as file:  # the current state, the same way
        now = b"".join(read_qcow2(file, backing=file_chunks(base)))
    current = tmp_path / "current.raw"
    qemu_img("convert", "-O", "raw", overlay, current)
    assert now == current.read_bytes()


def test_a_snapshot_the_image_lacks_is_not_found(tmp_path: Path) -> None:
    image = tmp_path / "plain.qcow2"
    qemu_img("create", "-f", "qcow2", image, "1M")
    qemu_img("snapshot", "-c", "one", image)
    with image.open("rb") as file, pytest.raises(ExpectedError) as raised:
        list(read_qcow2(file, snapshot="two"))
    assert raised.value.error.kind is ErrorKind.NOT_FOUND
