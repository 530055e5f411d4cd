"""What the download module decides from an image's first bytes, and its progress lines."""

from __future__ import annotations

import logging
import struct

import pytest

from pyrigaud.adapters.downloads import PROGRESS_EVERY_BYTES, logged_progress
from pyrigaud.adapters.hypervisors.libvirt.download import (
    QCOW2_MAGIC,
    UnusableImageError,
    image_format_of,
)
from pyrigaud.domain.disk_images import peek_header

MIB = 1024**2


def qcow2_header(*, version: int = 3, backing_offset: int = 0, incompatible: int = 0) -> bytes:
    """The fields image_format_of reads, at their offsets; the rest zero."""
    header = bytearray(512)
    struct.pack_into(">4sIQ", header, 0, QCOW2_MAGIC, version, backing_offset)
    struct.pack_into(">Q", header, 72, incompatible)
    return bytes(header)


@pytest.mark.parametrize("version", [2, 3])
def test_a_standalone_qcow2_is_qcow2(version: int) -> None:
    assert image_format_of(qcow2_header(version=version)) == "qcow2"


def test_anything_without_the_qcow2_magic_is_raw() -> None:
    assert image_format_of(b"\0" * 512) == "raw"


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (qcow2_header(backing_offset=512), "backing file"),
        (qcow2_header(incompatible=1 << 2), "external file"),
        (QCOW2_MAGIC + b"\0\0\0\3", "shorter than its own header"),
        (b"", "empty"),
    ],
)
def test_an_image_that_would_open_other_files_or_holds_nothing_is_refused(
    header: bytes, reason: str
) -> None:
    with pytest.raises(UnusableImageError, match=reason):
        image_format_of(header)


def test_a_version_2_image_has_no_feature_bits_to_refuse() -> None:
    assert image_format_of(qcow2_header(version=2, incompatible=1 << 2)) == "qcow2"


def test_the_peeked_header_spans_small_chunks_and_the_body_stays_whole() -> None:
    body = bytes(range(256)) * 4
    header, rest = peek_header(iter([body[i : i + 7] for i in range(0, len(body), 7)]))
    assert header == body[: len(header)]
    assert len(header) >= 72  # enough for every field image_format_of reads
    assert b"".join(rest) == body


def test_a_long_download_logs_its_progress_without_the_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chunk = bytes(MIB)
    count = PROGRESS_EVERY_BYTES // MIB + 10
    with caplog.at_level(logging.INFO):
        received = sum(
            len(c) for c in logged_progress(iter([chunk] * count), "root volume 'x'", count * MIB)
        )
    assert received == count * MIB
    assert [record.getMessage() for record in caplog.records] == [
        f"downloading root volume 'x': {PROGRESS_EVERY_BYTES // MIB} MiB of {count} MiB"
    ]
