"""The qcow2 writer against the real qemu-img: the images it writes check clean and read back
exactly."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.qcow2 import write_qcow2
from pyrigaud.domain.errors import ErrorKind, ProviderError

from support.disk_image import MIB, chunked, file_chunks, qemu_img, qemu_info, sparse_disk

GIB = 1024 * MIB


def written_image(path: Path, chunks: Iterable[bytes], capacity: int) -> Result[int, ProviderError]:
    with path.open("w+b") as file:
        return write_qcow2(chunks, capacity, file)


def write_image(path: Path, chunks: Iterable[bytes], capacity: int) -> int:
    match written_image(path, chunks, capacity):
        case Success(size):
            return int(size)
    pytest.fail("the image was refused")


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


def test_input_shorter_than_capacity_is_refused(tmp_path: Path) -> None:
    match written_image(tmp_path / "short.qcow2", [b"\1" * 131071], 131072):
        case Failure(error):
            assert error.kind is ErrorKind.FAILED_PRECONDITION
            assert "gave 131071 bytes" in error.message
        case written:
            pytest.fail(f"a short disk was written: {written}")
