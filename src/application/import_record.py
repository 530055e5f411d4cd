"""The record an import keeps beside its disk, for a retried import to answer from: its one
format, rendered and parsed here only (by ImportDisk, and by a landing site that needs to know
which disk an earlier record names before it trusts the record).

A record is one JSON object. The import's answer (`ImportResult`) lies at its top level, as
every release has written it (`json.dumps(ImportResult.model_dump())`), so a record kept by an
older release parses as it is; each other part of the record is an optional key of its own,
written only when the import knows it. A reader takes the keys it knows and passes over the
rest, so a record written by a newer release still answers a retry here.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from pyrigaud.domain.models import ImportResult
from pyrigaud.domain.values import Value


class ImportRecord(Value):
    """What an import kept beside its disk: its answer (`result`). A part added later is an
    optional field here, None when the import did not know it; `render_record` writes it under
    its field's name, `parse_record` reads it from there."""

    result: ImportResult


def render_record(record: ImportRecord) -> bytes:
    """The record's bytes: the answer's fields at the top level, then every other part set."""
    document = record.result.model_dump()
    document.update(record.model_dump(mode="json", exclude={"result"}, exclude_none=True))
    return json.dumps(document).encode()


def parse_record(record: bytes) -> ImportRecord | None:
    """The record `record` holds; None when it is none of ours (not a JSON object, or without
    an answer's fields of the right types). Keys it does not know are passed over."""
    try:
        document = json.loads(record)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    answer = {name: document[name] for name in ImportResult.model_fields if name in document}
    parts = {
        name: document[name]
        for name in ImportRecord.model_fields
        if name != "result" and name in document
    }
    try:
        return ImportRecord.model_validate({"result": answer, **parts})
    except ValidationError:
        return None
