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

from pyrigaud.application.hardware_manifest import hardware_fields, hardware_from
from pyrigaud.domain.hardware import BootNeed, VirtualHardware
from pyrigaud.domain.models import ImportResult
from pyrigaud.domain.values import Value

_BOOT_NEEDS = {need.value: need for need in BootNeed}


class ImportRecord(Value):
    """What an import kept beside its disk: its answer (`result`), and what Create from the
    disk needs to know of its guest: the hardware its source's manifest described (`hardware`,
    None without one) and the firmware the disk's first sectors can boot by (`boot`)."""

    result: ImportResult
    hardware: VirtualHardware | None = None
    boot: BootNeed = BootNeed.UNKNOWN


def render_record(record: ImportRecord) -> bytes:
    """The record's bytes: the answer's fields at the top level, then every other part known
    (a record of an import that knew nothing more is the bytes every release has kept)."""
    document: dict[str, object] = dict(record.result.model_dump())
    if record.hardware is not None:
        document["hardware"] = hardware_fields(record.hardware)
    if record.boot is not BootNeed.UNKNOWN:
        document["boot"] = record.boot.value
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
    try:
        result = ImportResult.model_validate(answer)
    except ValidationError:
        return None
    # The parts beyond the answer are read as a manifest is: a value this release does not
    # know (a later release's) is unknown, never a reason to take the record for another's.
    hardware, _ = hardware_from(document["hardware"]) if "hardware" in document else (None, "")
    boot = document.get("boot")
    return ImportRecord(
        result=result,
        hardware=hardware,
        boot=_BOOT_NEEDS.get(boot, BootNeed.UNKNOWN) if isinstance(boot, str) else BootNeed.UNKNOWN,
    )
