"""The import record's one format: what every release kept still parses, a newer record's
unknown keys are passed over, and what is none of ours is told apart."""

from __future__ import annotations

import json

import pytest

from pyrigaud.application.import_record import ImportRecord, parse_record, render_record
from pyrigaud.domain.hardware import BootNeed, DiskController, Firmware, NicModel, VirtualHardware
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
    newer = json.dumps({**ANSWER.model_dump(), "nvram": {"cpus": 2}, "boot": "tpm-only"})

    assert parse_record(newer.encode()) == ImportRecord(result=ANSWER)


def test_the_guest_s_hardware_and_boot_travel_in_the_record() -> None:
    hardware = VirtualHardware(
        source_hypervisor="vsphere",
        firmware=Firmware.UEFI,
        disk_controller=DiskController.PVSCSI,
        nic_models=(NicModel.VMXNET3, None),
        guest_os="rhel9_64Guest",
    )
    record = ImportRecord(result=ANSWER, hardware=hardware, boot=BootNeed.UEFI_ONLY)
    assert parse_record(render_record(record)) == record


def test_a_device_a_newer_release_knows_reads_as_unknown_not_as_another_s_record() -> None:
    newer = {
        **ANSWER.model_dump(),
        "hardware": {"source_hypervisor": "elsewhere", "disk_controller": "quantum-scsi"},
    }
    parsed = parse_record(json.dumps(newer).encode())
    assert parsed is not None
    assert parsed.hardware == VirtualHardware(source_hypervisor="elsewhere")
    broken = {**ANSWER.model_dump(), "hardware": {"secure_boot": "maybe"}, "boot": 7}
    assert parse_record(json.dumps(broken).encode()) == ImportRecord(result=ANSWER)


@pytest.mark.parametrize(
    "record",
    [b"", b"\xff\xfe", b"not json", b"[1, 2]", b'"web-root"', b'{"path": "/pool/x"}'],
    ids=["empty", "not text", "not json", "a list", "a string", "no disk id"],
)
def test_what_is_none_of_ours_parses_to_none(record: bytes) -> None:
    assert parse_record(record) is None
