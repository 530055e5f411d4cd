"""The client's flags become exactly the JSON the manager sends (Go field names, every key
present, null for nil), and pyrigaud's own wire parser reads them back to what was asked."""

from __future__ import annotations

import json

import pytest

from pyrigaud.client import payloads
from pyrigaud.client.payloads import PayloadError, VMSpec
from pyrigaud.entrypoints.grpc.wire.clone_requests import parse_clone
from pyrigaud.entrypoints.grpc.wire.storage_requests import parse_prepare_image
from pyrigaud.entrypoints.grpc.wire.vm_requests import parse_create, parse_reconfigure

GO_CLASS_KEYS = {
    "CPU",
    "MemoryMiB",
    "Firmware",
    "DiskDefaults",
    "GuestToolsPolicy",
    "ExtraConfig",
    "PerformanceProfile",
    "SecurityProfile",
    "ResourceLimits",
}
GO_NETWORK_KEYS = {
    "Name",
    "Portgroup",
    "NetworkName",
    "Bridge",
    "VLAN",
    "Model",
    "MacAddress",
    "IPPolicy",
    "StaticIP",
    "Prefix",
    "Gateway",
    "DNS",
    "PCISlotNumber",
}


@pytest.mark.parametrize(
    ("text", "mib"), [("512Mi", 512), ("2Gi", 2048), ("1G", 954), ("1.5Gi", 1536)]
)
def test_memory_is_a_kubernetes_quantity(text: str, mib: int) -> None:
    assert payloads.quantity_mib(text) == mib


@pytest.mark.parametrize("text", ["512", "2 gigs", "Gi", "-1Gi"])
def test_a_size_without_a_unit_is_refused_before_any_rpc(text: str) -> None:
    with pytest.raises(PayloadError, match="is not a size"):
        payloads.quantity_bytes(text)


def test_create_sends_go_field_names_with_every_key_and_nulls() -> None:
    spec = VMSpec(
        name="web",
        cpu=2,
        memory="2Gi",
        disk_size="20Gi",
        image_path="/images/base.qcow2",
        image_format="qcow2",
        networks=("lan",),
        disks=("5Gi",),
        datastore="fast",
    )
    fields = payloads.create_fields(spec)
    vm_class = json.loads(fields.class_json)
    assert set(vm_class) == GO_CLASS_KEYS
    assert (vm_class["CPU"], vm_class["MemoryMiB"], vm_class["ExtraConfig"]) == (2, 2048, None)
    assert vm_class["DiskDefaults"] == {"Type": "", "SizeGiB": 20}
    image = json.loads(fields.image_json)
    assert image == {
        "TemplateName": "",
        "Path": "/images/base.qcow2",
        "URL": "",
        "Format": "qcow2",
        "Checksum": "",
        "ChecksumType": "",
    }
    (network,) = json.loads(fields.networks_json)
    assert set(network) == GO_NETWORK_KEYS
    assert (network["NetworkName"], network["PCISlotNumber"]) == ("lan", None)
    assert json.loads(fields.disks_json) == [{"SizeGiB": 5, "Type": "", "Name": "disk1"}]
    parsed = parse_create(
        name="web",
        class_json=fields.class_json,
        image_json=fields.image_json,
        networks_json=fields.networks_json,
        disks_json=fields.disks_json,
        placement_json=fields.placement_json,
    ).unwrap()
    assert (parsed.vm_class.cpu, parsed.vm_class.memory_mib) == (2, 2048)
    assert parsed.image.path == "/images/base.qcow2"
    assert parsed.placement.datastore == "fast"
    assert [disk.size_gib for disk in parsed.disks] == [5]


def test_unset_lists_and_placement_are_what_the_manager_sends_for_nil() -> None:
    fields = payloads.create_fields(VMSpec(name="bare", cpu=1, memory="256Mi"))
    assert (fields.networks_json, fields.disks_json, fields.placement_json) == ("null", "null", "")
    assert json.loads(fields.class_json)["DiskDefaults"] is None


def test_reconfigure_sends_the_whole_create_request_and_zero_means_no_change() -> None:
    desired = payloads.desired_json(VMSpec(name="web", memory="4Gi"))
    document = json.loads(desired)
    assert set(document) == {
        "Name",
        "Class",
        "Image",
        "Networks",
        "Disks",
        "UserData",
        "MetaData",
        "Placement",
        "Tags",
    }
    changes = parse_reconfigure(desired).unwrap()
    assert (changes.cpu, changes.memory_mib) == (None, 4096)


def test_clone_and_image_prepare_send_crd_specs_in_camel_case() -> None:
    class_json = payloads.clone_class_json(4, "8Gi")
    customize = payloads.customize_json("copy", "example.test", "Europe/Paris", b"#cloud-config\n")
    assert json.loads(class_json) == {"cpu": 4, "memory": "8Gi"}
    assert json.loads(customize)["userData"] == {"cloudInit": {"inline": "#cloud-config\n"}}
    parsed = parse_clone(
        source_vm_id="vm-1",
        target_name="copy",
        linked=False,
        class_json=class_json,
        placement_json="",
        customize_json=customize,
    ).unwrap()
    assert (parsed.cpu, parsed.memory_mib) == (4, 8192)
    assert parsed.customization is not None
    assert parsed.customization.hostname == "copy"
    image_json = payloads.image_prepare_json(
        path="",
        url="https://img.test/b.qcow2",
        template="",
        image_format="qcow2",
        checksum="",
        storage_pool="",
    )
    assert json.loads(image_json)["source"] == {
        "libvirt": {"url": "https://img.test/b.qcow2", "format": "qcow2"}
    }
    prepared = parse_prepare_image(image_json=image_json, target_name="b", storage_hint="")
    assert prepared.unwrap().source.url == "https://img.test/b.qcow2"
    with pytest.raises(PayloadError):
        payloads.image_prepare_json(
            path="", url="", template="", image_format="", checksum="", storage_pool=""
        )
