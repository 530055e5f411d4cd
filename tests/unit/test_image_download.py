"""A downloaded image's first bytes peeked without losing any, and the download's progress lines
(its format is the image judge's: tests/unit/disk_images/test_image_judge.py)."""

from __future__ import annotations

import logging

import pytest

from pyrigaud.adapters.downloads import PROGRESS_EVERY_BYTES, logged_progress
from pyrigaud.domain.disk_images import peek_header

MIB = 1024**2


def test_the_peeked_header_spans_small_chunks_and_the_body_stays_whole() -> None:
    body = bytes(range(256)) * 4
    header, rest = peek_header(iter([body[i : i + 7] for i in range(0, len(body), 7)]))
    assert header == body[: len(header)]
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
