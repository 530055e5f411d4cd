"""The hardware manifest written beside a staged disk: what is written reads back, and a
manifest that cannot be trusted is ignored with its reason, never raising."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyrigaud.application.hardware_manifest import (
    KIND,
    MAX_MANIFEST_BYTES,
    MAX_TEXT_CHARS,
    VERSION,
    manifest_name,
    read,
    render,
)
from pyrigaud.domain.hardware import DiskController, Firmware, NicModel, VirtualHardware

DISK = hashlib.sha256(b"the staged disk").hexdigest()
OTHER_DISK = hashlib.sha256(b"another disk").hexdigest()
VSPHERE_GUEST = VirtualHardware(
    source_hypervisor="vsphere",
    firmware=Firmware.UEFI,
    secure_boot=True,
    disk_controller=DiskController.PVSCSI,
    nic_models=(NicModel.VMXNET3, None, NicModel.E1000E),
    machine_type="vmx-19",
    guest_os="rhel9_64Guest",
)

texts = st.text(max_size=MAX_TEXT_CHARS)
hardware = st.builds(
    VirtualHardware,
    source_hypervisor=texts,
    firmware=st.sampled_from(Firmware),
    secure_boot=st.booleans(),
    disk_controller=st.none() | st.sampled_from(DiskController),
    nic_models=st.lists(st.none() | st.sampled_from(NicModel), max_size=10).map(tuple),
    machine_type=texts,
    guest_os=texts,
)


def manifest(fields: dict[str, Any] | None = None, **top: Any) -> bytes:
    """VSPHERE_GUEST's manifest with some hardware `fields` and `top` keys changed."""
    written = json.loads(render(VSPHERE_GUEST, DISK))
    written["hardware"].update(fields or {})
    written.update(top)
    return json.dumps(written).encode()


@settings(max_examples=200, deadline=None)
@given(hardware=hardware, checksum=st.sampled_from([DISK, DISK.upper()]))
def test_what_is_rendered_reads_back(hardware: VirtualHardware, checksum: str) -> None:
    assert read(render(hardware, checksum), DISK) == (hardware, "")


def test_the_manifest_is_a_small_sorted_json_object_named_after_the_staged_disk() -> None:
    raw = render(VSPHERE_GUEST, DISK)
    assert manifest_name("vmmigrations/ns/m/export.qcow2") == (
        "vmmigrations/ns/m/export.qcow2.hardware.json"
    )
    assert json.loads(raw) == {
        "kind": KIND,
        "version": VERSION,
        "disk_sha256": DISK,
        "hardware": {
            "source_hypervisor": "vsphere",
            "firmware": "UEFI",
            "secure_boot": True,
            "disk_controller": "pvscsi",
            "nic_models": ["vmxnet3", None, "e1000e"],
            "machine_type": "vmx-19",
            "guest_os": "rhel9_64Guest",
        },
    }
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()


def test_a_manifest_of_another_disk_is_ignored() -> None:
    assert read(render(VSPHERE_GUEST, OTHER_DISK), DISK) == (
        None,
        "its disk_sha256 is not the staged disk's (a manifest of another export)",
    )


def test_values_a_newer_release_knows_read_as_unknown() -> None:
    newer = manifest(
        {
            "disk_controller": "virtio-pmem",
            "nic_models": ["vmxnet4", "e1000"],
            "firmware": "UEFI-CSM",
            "added_later": {"anything": 1},
        }
    )
    got, reason = read(newer, DISK)
    assert reason == ""
    assert got == VSPHERE_GUEST.model_copy(
        update={
            "disk_controller": None,
            "nic_models": (None, NicModel.E1000),
            "firmware": Firmware.BIOS,
        }
    )


def test_fields_left_out_read_as_their_defaults() -> None:
    got, reason = read(
        json.dumps(
            {"kind": KIND, "version": VERSION, "disk_sha256": DISK, "hardware": {}}
        ).encode(),
        DISK,
    )
    assert (got, reason) == (VirtualHardware(source_hypervisor=""), "")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b" " * (MAX_MANIFEST_BYTES + 1), f"it is larger than {MAX_MANIFEST_BYTES} bytes"),
        (b'{"kind": ', "it is not JSON"),
        (b"\xff\xfe\xfa", "it is not JSON"),
        (b"[" * 8000 + b"]" * 8000, "it is not JSON"),  # nested past the recursion limit
        (b"[1, 2]", "it is not a JSON object"),
        (manifest(kind="something else"), f"it is not a {KIND}"),
        (manifest(version="1"), f"it is not a {KIND}"),
        (manifest(version=2), f"it is of version 2; this release reads {VERSION}"),
        (manifest(disk_sha256="abc"), "its disk_sha256 is not a SHA-256"),
        (manifest(hardware=None), "its hardware is not a JSON object"),
        (
            manifest({"secure_boot": "yes"}),
            "its secure_boot is not true or false",
        ),
        (manifest({"firmware": 1}), "its firmware is not a text"),
        (
            manifest({"disk_controller": ["pvscsi"]}),
            "its disk_controller is not a text or null",
        ),
        (
            manifest({"nic_models": "vmxnet3"}),
            "its nic_models is not a list of texts or nulls",
        ),
        (
            manifest({"nic_models": [1]}),
            "its nic_models is not a list of texts or nulls",
        ),
        (
            manifest({"guest_os": "x" * (MAX_TEXT_CHARS + 1)}),
            f"its guest_os is not a text of at most {MAX_TEXT_CHARS} characters",
        ),
        (
            manifest({"machine_type": None}),
            f"its machine_type is not a text of at most {MAX_TEXT_CHARS} characters",
        ),
    ],
)
def test_a_manifest_that_cannot_be_trusted_is_ignored_with_its_reason(
    raw: bytes, reason: str
) -> None:
    assert read(raw, DISK) == (None, reason)


@settings(max_examples=500, deadline=None)
@given(raw=st.binary(max_size=MAX_MANIFEST_BYTES + 10))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    got, reason = read(raw, DISK)
    assert (got is None) == bool(reason)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from(
            [
                "source_hypervisor",
                "firmware",
                "secure_boot",
                "disk_controller",
                "nic_models",
                "machine_type",
                "guest_os",
            ]
        ),
        json_values,
    )
)
def test_arbitrary_hardware_fields_never_raise(fields: dict[str, Any]) -> None:
    raw = json.dumps({"kind": KIND, "version": VERSION, "disk_sha256": DISK, "hardware": fields})
    got, reason = read(raw.encode(), DISK)
    assert (got is None) == bool(reason)
