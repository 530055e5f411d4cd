"""A staged image's format from its first bytes; images that would open other host files are
refused. The headers come from the real qemu-img."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyrigaud.adapters.disk_images.formats import HEADER_BYTES, disk_format_of
from pyrigaud.adapters.disk_images.scratch import scratch_file
from pyrigaud.domain.errors import ErrorKind, ExpectedError

from disk_image_support import qemu_img


def header_of(tmp_path: Path, *create: str) -> bytes:
    image = tmp_path / "image"
    qemu_img("create", *create, image, "1M")
    return image.read_bytes()[:HEADER_BYTES]


@pytest.mark.parametrize(
    ("create", "expected"),
    [
        (["-f", "qcow2"], "qcow2"),
        (["-f", "qcow2", "-o", "compat=0.10"], "qcow2"),
        (["-f", "vmdk"], "vmdk"),
        (["-f", "vmdk", "-o", "subformat=streamOptimized"], "vmdk"),
        (["-f", "raw"], "raw"),
    ],
)
def test_formats_are_told_by_their_bytes(tmp_path: Path, create: list[str], expected: str) -> None:
    assert disk_format_of(header_of(tmp_path, *create)) == expected


@pytest.mark.parametrize(
    ("create", "problem"),
    [
        (["-f", "qcow2", "-b", "{dir}/base", "-F", "raw"], "names a backing file"),
        (["-f", "qcow2", "-o", "data_file={dir}/data"], "external file"),
        (["-f", "vmdk", "-o", "subformat=twoGbMaxExtentSparse"], "names other extent files"),
    ],
)
def test_images_naming_other_files_are_refused(
    tmp_path: Path, create: list[str], problem: str
) -> None:
    qemu_img("create", "-f", "raw", tmp_path / "base", "1M")
    header = header_of(tmp_path, *(part.format(dir=tmp_path) for part in create))
    with pytest.raises(ExpectedError, match=problem) as raised:
        disk_format_of(header, field="source")
    assert raised.value.error.kind is ErrorKind.INVALID_SPEC
    assert raised.value.error.message.startswith("source: ")


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (b"", "empty image"),
        (b"KDMV\1\0\0\0\3\0\0\0" + bytes(500), "names other extent files"),
        (b"QFI\xfb\0\0\0\3", "shorter than its own header"),
    ],
)
def test_headers_that_cannot_be_used_are_refused(header: bytes, problem: str) -> None:
    with pytest.raises(ExpectedError, match=problem):
        disk_format_of(header)


def test_scratch_file_leaves_no_name_and_closes(tmp_path: Path) -> None:
    with scratch_file(str(tmp_path)) as file:
        file.write(b"scratch")
        file.seek(0)
        assert file.read() == b"scratch"
        assert os.listdir(tmp_path) == []  # unlinked at once: a killed provider leaves nothing
    assert file.closed
