"""A staged image's disk read through qemu-img's map: byte for byte what qemu reads, or None
where qemu cannot point at the data (it is converted instead), and refused where the map points
outside the image or the disk."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from returns.result import Result, Success

from pyrigaud.adapters.disk_images.qemu_map import MappedDisk, mapped_disk
from pyrigaud.domain.disk_images import JudgedImage
from pyrigaud.domain.errors import ErrorKind, ProviderError

from support import CountingWatch, error_of, ok
from support.disk_image import qemu_img, qemu_info
from support.image_corpus import CorpusImage, oracle_raw, valid_image

MAPPED = (
    "qcow2-v2",
    "qcow2-v3",
    "qcow2-512-byte-clusters",
    "qcow2-2-mib-clusters",
    "qcow2-extended-l2",
    "qcow2-lazy-refcounts",
    "qcow2-internal-snapshot",
    "vmdk-monolithic-sparse",
)
CONVERTED = ("qcow2-zlib", "qcow2-zstd", "vmdk-stream-optimized")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def _judged(path: Path, disk_format: str) -> JudgedImage:
    return JudgedImage(format=disk_format, virtual_size_bytes=qemu_info(path)["virtual-size"])


@dataclass(frozen=True)
class _Read:
    mapped: MappedDisk | None  # mapped_disk's answer
    disk: bytes  # what its chunks gave: all of the disk, or up to the failure that cut them
    ended: Result[None, ProviderError]  # what reading them to their end answered


def _read(image: Path, judged: JudgedImage, scratch: Path) -> _Read:
    with image.open("rb") as file:
        mapped = ok(mapped_disk(file, judged, str(scratch), CountingWatch()))
        if mapped is None:
            return _Read(None, b"", Success(None))
        given: list[bytes] = []
        ended = mapped.chunks.consumed_by(given.extend)
        return _Read(mapped, b"".join(given), ended)


@pytest.mark.parametrize("name", MAPPED)
def test_plain_data_is_read_through_the_map_as_qemu_reads_the_disk(
    name: str, corpus: Path, tmp_path: Path
) -> None:
    image = valid_image(name, corpus)

    read = _read(image.path, _judged(image.path, image.format), tmp_path)

    assert read.mapped is not None
    assert read.ended == Success(None)
    assert read.disk == oracle_raw(image, corpus)
    assert read.mapped.capacity_bytes == len(read.disk)


@pytest.mark.parametrize("name", CONVERTED)
def test_compressed_data_qemu_cannot_point_at_is_left_to_a_conversion(
    name: str, corpus: Path, tmp_path: Path
) -> None:
    image = valid_image(name, corpus)

    read = _read(image.path, _judged(image.path, image.format), tmp_path)

    assert read.mapped is None


def test_data_in_another_file_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "external.qcow2"
    qemu_img("create", "-f", "qcow2", "-o", f"data_file={tmp_path / 'data.raw'}", image, "1M")
    qemu_img("convert", "-n", "-O", "qcow2", _data(tmp_path), image)

    read = _read(image, JudgedImage(format="qcow2", virtual_size_bytes=2**20), tmp_path)

    assert read.mapped is not None
    refused = error_of(read.ended)
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert "data in another file than the image" in refused.message
    assert read.disk == b""


def test_an_extent_past_the_image_files_end_is_refused(corpus: Path, tmp_path: Path) -> None:
    image = _cut_copy(valid_image("qcow2-v3", corpus), tmp_path)

    read = _read(image, _judged(image, "qcow2"), tmp_path)

    assert read.mapped is not None
    refused = error_of(read.ended)
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert "past the image file's end" in refused.message


def test_an_extent_past_the_judged_disks_end_is_refused(corpus: Path, tmp_path: Path) -> None:
    image = valid_image("qcow2-v3", corpus)
    smaller = JudgedImage(format="qcow2", virtual_size_bytes=2**20)

    read = _read(image.path, smaller, tmp_path)

    assert read.mapped is not None
    refused = error_of(read.ended)
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert "past the disk's end" in refused.message


def _data(directory: Path) -> Path:
    raw = directory / "source.raw"
    raw.write_bytes(b"\x5a" * 65536 + bytes(65536) + b"\xa5" * 65536)
    return raw


def _cut_copy(image: CorpusImage, directory: Path) -> Path:
    """A copy of `image` without its last 64 KiB: a data cluster its tables still point at."""
    data = image.path.read_bytes()
    cut = directory / "cut.qcow2"
    cut.write_bytes(data[: len(data) - 65536])
    return cut
