"""Manager JSON -> domain: Go decoder semantics and the input bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from returns.result import Result

from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import CreateRequest, Firmware
from pyrigaud.domain.power import PowerOp
from pyrigaud.domain.quantity import quantity_to_mib
from pyrigaud.entrypoints.grpc import wire as payloads
from pyrigaud.entrypoints.grpc.wire.field_names import wire_name

from support import error_kind, error_of, ok

# What the manager really sends: Go field names, every field present, nil as null.
GO_CLASS = {
    "CPU": 2,
    "MemoryMiB": 2048,
    "Firmware": "UEFI",
    "DiskDefaults": {"Type": "thin", "SizeGiB": 40},
    "GuestToolsPolicy": "install",
    "ExtraConfig": {"vsphere.hardwareVersion": "19"},
    "PerformanceProfile": {
        "LatencySensitivity": "",
        "CPUHotAddEnabled": True,
        "MemoryHotAddEnabled": False,
        "VirtualizationBasedSecurity": False,
        "NestedVirtualization": True,
        "HyperThreadingPolicy": "",
    },
    "SecurityProfile": None,
    "ResourceLimits": {
        "CPULimit": None,
        "CPUReservation": 500,
        "MemoryLimitMiB": None,
        "MemoryReservationMiB": None,
        "CPUShares": None,
    },
}
GO_NETWORK = {
    "Name": "lan",
    "Portgroup": "",
    "NetworkName": "default",
    "Bridge": "",
    "VLAN": 0,
    "Model": "virtio",
    "MacAddress": "52:54:00:AA:BB:CC",
    "IPPolicy": "static",
    "StaticIP": "192.0.2.10/24",
    "Prefix": 24,
    "Gateway": "192.0.2.1",
    "DNS": "192.0.2.53, 192.0.2.54",
    "PCISlotNumber": None,
}


def create(**fields: object) -> Result[CreateRequest, ProviderError]:
    arguments: dict[str, Any] = {"name": "web-1", "class_json": json.dumps(GO_CLASS)}
    arguments.update(fields)
    return payloads.parse_create(**arguments)


def test_the_managers_create_payload_parses_completely() -> None:
    request = ok(
        create(
            image_json=json.dumps(
                {
                    "TemplateName": "",
                    "Path": "/img/a.qcow2",
                    "URL": "",
                    "Format": "qcow2",
                    "Checksum": "",
                    "ChecksumType": "sha256",
                }
            ),
            networks_json=json.dumps([GO_NETWORK]),
            disks_json=json.dumps([{"SizeGiB": 10, "Type": "thin", "Name": "data"}]),
            placement_json=json.dumps(
                {"Datastore": "fast", "StoragePod": "", "Cluster": "", "Folder": "", "Host": ""}
            ),
            user_data=b"#cloud-config\n",
            meta_data=b"instance-id: web-1\n",
            tags=["a", "b"],
        )
    )
    assert request.vm_class.cpu == 2
    assert request.vm_class.firmware is Firmware.UEFI
    assert request.vm_class.disk_defaults.size_gib == 40
    assert request.vm_class.performance.cpu_hot_add
    assert request.vm_class.limits.cpu_reservation == 500
    assert request.vm_class.extra_config == {"vsphere.hardwareVersion": "19"}
    assert request.image.path == "/img/a.qcow2"
    network = request.networks[0]
    assert (network.network_name, network.mac_address) == ("default", "52:54:00:aa:bb:cc")
    assert network.dns == ("192.0.2.53", "192.0.2.54")
    assert request.disks[0].size_gib == 10
    assert request.placement.datastore == "fast"
    assert request.tags == ("a", "b")


def test_keys_match_case_insensitively_and_unknown_keys_are_ignored() -> None:
    request = ok(create(class_json='{"cpu": 4, "memorymib": 512, "firmware": "efi", "Bogus": 1}'))
    assert (request.vm_class.cpu, request.vm_class.memory_mib) == (4, 512)
    assert request.vm_class.firmware is Firmware.UEFI


def test_null_lists_and_objects_and_empty_payloads_are_zero_values() -> None:
    request = ok(
        create(
            class_json='{"CPU": 1, "MemoryMiB": 1, "DiskDefaults": null, "ExtraConfig": null}',
            image_json="null",
            networks_json="null",
            disks_json="",
            placement_json="",
        )
    )
    assert request.image.is_blank
    assert request.networks == ()
    assert request.disks == ()
    assert request.vm_class.disk_defaults.size_gib == 0


@pytest.mark.parametrize(
    ("fields", "field_named"),
    [
        ({"name": ""}, "name"),
        ({"name": "-leading-dash"}, "name"),
        ({"name": "x" * 129}, "name"),
        ({"name": "white space"}, "name"),
        ({"class_json": '{"CPU": 0, "MemoryMiB": 512}'}, "class_json.CPU"),
        ({"class_json": '{"CPU": 1025, "MemoryMiB": 512}'}, "class_json.CPU"),
        ({"class_json": '{"CPU": "two", "MemoryMiB": 512}'}, "class_json.CPU"),
        ({"class_json": '{"CPU": 1.5, "MemoryMiB": 512}'}, "class_json.CPU"),
        ({"class_json": '{"CPU": true, "MemoryMiB": 512}'}, "class_json.CPU"),
        ({"class_json": '{"CPU": 1, "MemoryMiB": 99999999999}'}, "class_json.MemoryMiB"),
        (
            {"class_json": '{"CPU": 1, "MemoryMiB": 1, "Firmware": "coreboot"}'},
            "class_json.Firmware",
        ),
        (
            {"class_json": '{"CPU": 1, "MemoryMiB": 1, "DiskDefaults": {"SizeGiB": 70000}}'},
            "class_json.DiskDefaults.SizeGiB",
        ),
        ({"class_json": "[1, 2]"}, "class_json"),
        ({"class_json": "{not json"}, "class_json"),
        ({"disks_json": json.dumps([{"SizeGiB": 1}] * 33)}, "disks_json"),
        ({"disks_json": json.dumps([{"SizeGiB": 0}])}, "disks_json[0].SizeGiB"),
        ({"networks_json": json.dumps([{}] * 17)}, "networks_json"),
        ({"networks_json": '[{"MacAddress": "zz"}]'}, "networks_json[0].MacAddress"),
        ({"networks_json": '[{"StaticIP": "300.1.1.1"}]'}, "networks_json[0].StaticIP"),
        ({"networks_json": '{"Name": "not a list"}'}, "networks_json"),
        ({"user_data": b"x" * (1024 * 1024 + 1)}, "user_data"),
        ({"meta_data": b"x" * (1024 * 1024 + 1)}, "meta_data"),
        ({"tags": ["t"] * 65}, "tags"),
        (
            {"class_json": '{"CPU": 1, "MemoryMiB": 1, "GuestToolsPolicy": "\\ud800"}'},
            "class_json.GuestToolsPolicy",
        ),
    ],
)
def test_bad_input_is_an_invalid_spec_naming_the_field(
    fields: dict[str, object], field_named: str
) -> None:
    error = error_of(create(**fields))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith(field_named + ":"), error.message


def test_deeply_nested_json_is_refused_not_crashed() -> None:
    assert error_kind(create(image_json="[" * 100_000)) is ErrorKind.INVALID_SPEC


def test_case_variants_of_one_key_resolve_like_go_last_wins() -> None:
    request = ok(create(class_json='{"cpu": 1, "CPU": 3, "MemoryMiB": 64}'))
    assert request.vm_class.cpu == 3


def test_reconfigure_missing_null_and_zero_mean_no_change() -> None:
    assert ok(payloads.parse_reconfigure("")).is_empty
    assert ok(payloads.parse_reconfigure('{"Class": null, "Disks": null}')).is_empty
    assert ok(payloads.parse_reconfigure('{"Class": {"CPU": 0, "MemoryMiB": 0}}')).is_empty
    changes = ok(
        payloads.parse_reconfigure(
            '{"Name": "x", "Class": {"CPU": 4, "MemoryMiB": 8192, "DiskDefaults": {"SizeGiB": 50}},'
            ' "Disks": [{"SizeGiB": 20}], "UserData": null, "Tags": null}'
        )
    )
    assert (changes.cpu, changes.memory_mib, changes.root_disk_gib) == (4, 8192, 50)
    assert changes.disks[0].size_gib == 20
    assert (
        error_kind(payloads.parse_reconfigure('{"Class": {"CPU": -1}}')) is ErrorKind.INVALID_SPEC
    )


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("8Gi", 8192),
        ("512Mi", 512),
        ("2G", 1908),
        ("1.5Gi", 1536),
        ("1", 1),
        ("1e9", 954),
        ("1Ki", 1),
        ("0", 0),
        ("100m", 1),
    ],
)
def test_quantities_round_up_to_whole_mib(text: str, mib: int) -> None:
    assert quantity_to_mib(text) == mib


@pytest.mark.parametrize("text", ["", "-1Gi", "8GB", "Gi", "1e999999", "1.2.3", "x" * 100])
def test_bad_quantities_are_refused(text: str) -> None:
    assert quantity_to_mib(text) is None


@pytest.mark.parametrize(
    ("customization", "field"),
    [
        ({"timeZone": "Europe/../../etc"}, "customize_json.timeZone"),
        ({"timeZone": "not a zone;"}, "customize_json.timeZone"),
        ({"domain": "bad_domain;"}, "customize_json.domain"),
        ({"domain": "a..b"}, "customize_json.domain"),
    ],
)
def test_customization_names_that_no_guest_can_take_are_refused(
    customization: dict[str, str], field: str
) -> None:
    error = error_of(
        payloads.parse_clone(
            source_vm_id="vm-1",
            target_name="copy",
            linked=False,
            class_json="",
            placement_json="",
            customize_json=json.dumps(customization),
        )
    )
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith(f"{field}:")


def test_clone_payloads_are_crd_specs() -> None:
    request = ok(
        payloads.parse_clone(
            source_vm_id="vm-1",
            target_name="copy",
            linked=True,
            class_json='{"cpu": 4, "memory": "8Gi"}',
            placement_json='{"name": "gold"}',
            customize_json=json.dumps(
                {
                    "hostname": "copy",
                    "domain": "example.test",
                    "timeZone": "UTC",
                    "networks": [
                        {
                            "name": "lan",
                            "ipAddress": "192.0.2.20",
                            "prefix": 24,
                            "gateway": "192.0.2.1",
                            "dns": ["192.0.2.53"],
                        }
                    ],
                    "userData": {"cloudInit": {"inline": "#cloud-config\n"}},
                }
            ),
        )
    )
    assert (request.cpu, request.memory_mib, request.placement_policy) == (4, 8192, "gold")
    assert request.customization is not None
    assert request.customization.networks[0].static_ip == "192.0.2.20"
    assert request.customization.user_data == b"#cloud-config\n"
    empty = ok(
        payloads.parse_clone(
            source_vm_id="vm-1",
            target_name="c2",
            linked=False,
            class_json="",
            placement_json="",
            customize_json="",
        )
    )
    assert (empty.cpu, empty.memory_mib, empty.customization) == (None, None, None)
    bad = payloads.parse_clone(
        source_vm_id="vm-1",
        target_name="c3",
        linked=False,
        class_json='{"memory": "lots"}',
        placement_json="",
        customize_json="",
    )
    assert error_of(bad).message.startswith("class_json.memory:")


def test_image_prepare_accepts_the_crd_and_the_flat_shape() -> None:
    nested = ok(
        payloads.parse_prepare_image(
            image_json='{"source": {"libvirt": {"url": "http://127.0.0.1/x.qcow2", '
            '"checksum": "ab", "checksumType": "sha256"}}, "prepare": {}}',
            target_name="",
            storage_hint="",
        )
    )
    assert (nested.source.origin, nested.source.url) == ("libvirt", "http://127.0.0.1/x.qcow2")
    assert nested.target_name.startswith("x.qcow2-")
    flat = ok(
        payloads.parse_prepare_image(
            image_json='{"TemplateName": "ubuntu-22"}', target_name="ubuntu", storage_hint=""
        )
    )
    assert flat.source.template_name == "ubuntu-22"
    nothing = payloads.parse_prepare_image(image_json="{}", target_name="x", storage_hint="")
    assert error_kind(nothing) is ErrorKind.INVALID_SPEC


def test_power_ops_outside_the_enum_and_bad_timeouts_are_invalid() -> None:
    assert ok(payloads.parse_power_op(4, 60)) == (PowerOp.SHUTDOWN_GRACEFUL, 60)
    for op, timeout, field in [
        (0, 0, "op"),
        (9, 0, "op"),
        (-1, 0, "op"),
        (1, -5, "graceful_timeout_seconds"),
    ]:
        assert error_of(payloads.parse_power_op(op, timeout)).message.startswith(field)


def test_disk_transfer_requests_are_checked() -> None:
    common: dict[str, Any] = {
        "vm_id": "vm",
        "disk_id": "",
        "snapshot_id": "",
        "compress": False,
        "credentials": {},
        "storage_options_json": "",
        "transfer_mode": "",
        "staging_types": STAGING_TYPES,
    }
    export = ok(
        payloads.parse_export(
            destination_url="pvc://mig/vm.qcow2", disk_format="", backend_type="", **common
        )
    )
    assert (export.format, export.staging_type, export.mode.value) == ("qcow2", "pvc", "relay")
    wrong_scheme = payloads.parse_export(
        destination_url="s3://b/k", disk_format="", backend_type="pvc", **common
    )
    assert error_of(wrong_scheme).message.startswith("destination_url")
    bad_format = payloads.parse_export(
        destination_url="pvc://m/x", disk_format="iso", backend_type="", **common
    )
    assert error_of(bad_format).message.startswith("format")


def test_bad_fields_are_named_as_every_backend_names_them() -> None:
    """A field the parser refuses is named as a backend's refusal of it reads on the wire."""
    nic = {"NetworkName": 7}
    bad_image = create(image_json=json.dumps({"URL": 1}))
    bad_nic = create(networks_json=json.dumps([{}, nic]))
    bad_disk = create(disks_json=json.dumps([{"SizeGiB": 1, "Type": 2}]))
    bad_placement = create(placement_json=json.dumps({"Datastore": []}))
    for result, field in (
        (bad_image, fields.IMAGE_URL),
        (bad_nic, fields.network_name(1)),
        (bad_disk, fields.disk_type(0)),
        (bad_placement, fields.PLACEMENT_DATASTORE),
    ):
        assert error_of(result).message.startswith(f"{wire_name(field)}: ")
