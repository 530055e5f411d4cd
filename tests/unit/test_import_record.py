"""The import record's one format: what every release kept still parses, a newer record's
unknown keys are passed over, and what is none of ours is told apart."""

from __future__ import annotations

import json

import pytest

from pyrigaud.application.import_record import ImportRecord, parse_record, render_record
from pyrigaud.domain.models import ImportResult

ANSWER = ImportResult(
    disk_id="web-root", path="/pool/web-root.qcow2", actual_size_bytes=4096, checksum="ab" * 32
)


def test_a_record_is_rendered_as_every_release_kept_it() -> None:
    assert render_record(ImportRecord(result=ANSWER)) == json.dumps(ANSWER.model_dump()).encode()


def test_a_record_kept_by_an_earlier_release_parses() -> None:
    kept = json.dumps(ANSWER.model_dump()).encode()  # the exact bytes earlier releases wrote

    assert parse_record(kept) == ImportRecord(result=ANSWER)


def test_keys_a_newer_release_added_are_passed_over() -> None:
    newer = json.dumps({**ANSWER.model_dump(), "hardware": {"cpus": 2}, "boot": "uefi"})

    assert parse_record(newer.encode()) == ImportRecord(result=ANSWER)


@pytest.mark.parametrize(
    "record",
    [b"", b"\xff\xfe", b"not json", b"[1, 2]", b'"web-root"', b'{"path": "/pool/x"}'],
    ids=["empty", "not text", "not json", "a list", "a string", "no disk id"],
)
def test_what_is_none_of_ours_parses_to_none(record: bytes) -> None:
    assert parse_record(record) is None
