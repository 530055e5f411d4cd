"""The manager's JSON payloads, built from flags in the manager's own terms (docs/contract.md).

Create and Reconfigure carry Go structs marshalled without json tags: PascalCase keys, every
field present, nil as `null`. Clone and ImagePrepare carry CRD specs with camelCase keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|K|M|G|T)\s*$")
_FACTORS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
MIB = 2**20
GIB = 2**30


class PayloadError(ValueError):
    """A flag value the manager could not have sent (said before any RPC)."""


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity with a unit (`2Gi`, `512Mi`, `1G`) in bytes."""
    matched = _QUANTITY.match(text)
    if matched is None:
        raise PayloadError(f"{text!r} is not a size such as 512Mi or 2Gi")
    return int(float(matched.group(1)) * _FACTORS[matched.group(2)])


def quantity_mib(text: str) -> int:
    return -(-quantity_bytes(text) // MIB)


def quantity_gib(text: str) -> int:
    return -(-quantity_bytes(text) // GIB)


@dataclass(frozen=True)
class VMSpec:
    """What a VirtualMachine + VMClass + VMImage say, in the manager's terms."""

    name: str = ""
    cpu: int = 0
    memory: str = ""  # a quantity; "" = no change / unset
    firmware: str = ""
    disk_size: str = ""  # the root disk (DiskDefaults.SizeGiB)
    image_path: str = ""
    image_url: str = ""
    template: str = ""
    image_format: str = ""
    checksum: str = ""
    networks: Sequence[str] = ()
    disks: Sequence[str] = ()  # extra disk sizes
    datastore: str = ""
    cluster: str = ""
    folder: str = ""
    host: str = ""
    tags: Sequence[str] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # raw image JSON to start from


def vm_class(spec: VMSpec) -> dict[str, Any]:
    return {
        "CPU": spec.cpu,
        "MemoryMiB": quantity_mib(spec.memory) if spec.memory else 0,
        "Firmware": spec.firmware,
        "DiskDefaults": (
            {"Type": "", "SizeGiB": quantity_gib(spec.disk_size)} if spec.disk_size else None
        ),
        "GuestToolsPolicy": "",
        "ExtraConfig": None,
        "PerformanceProfile": None,
        "SecurityProfile": None,
        "ResourceLimits": None,
    }


def vm_image(spec: VMSpec) -> dict[str, Any]:
    image = {
        "TemplateName": spec.template,
        "Path": spec.image_path,
        "URL": spec.image_url,
        "Format": spec.image_format,
        "Checksum": spec.checksum,
        "ChecksumType": "sha256" if spec.checksum else "",
    }
    image.update(spec.extra)
    return image


def networks(names: Sequence[str]) -> list[dict[str, Any]] | None:
    if not names:
        return None
    return [
        {
            "Name": name,
            "Portgroup": "",
            "NetworkName": name,
            "Bridge": "",
            "VLAN": 0,
            "Model": "",
            "MacAddress": "",
            "IPPolicy": "",
            "StaticIP": "",
            "Prefix": 0,
            "Gateway": "",
            "DNS": "",
            "PCISlotNumber": None,
        }
        for name in names
    ]


def disks(sizes: Sequence[str]) -> list[dict[str, Any]] | None:
    if not sizes:
        return None
    return [
        {"SizeGiB": quantity_gib(size), "Type": "", "Name": f"disk{index + 1}"}
        for index, size in enumerate(sizes)
    ]


def placement(spec: VMSpec) -> dict[str, str] | None:
    where = {
        "Datastore": spec.datastore,
        "StoragePod": "",
        "Cluster": spec.cluster,
        "Folder": spec.folder,
        "Host": spec.host,
    }
    return where if any(where.values()) else None


@dataclass(frozen=True)
class CreateFields:
    """The string fields of a CreateRequest, as the manager fills them."""

    class_json: str
    image_json: str
    networks_json: str
    disks_json: str
    placement_json: str


def create_fields(spec: VMSpec) -> CreateFields:
    where = placement(spec)
    return CreateFields(
        class_json=json.dumps(vm_class(spec)),
        image_json=json.dumps(vm_image(spec)),
        networks_json=json.dumps(networks(spec.networks)),
        disks_json=json.dumps(disks(spec.disks)),
        placement_json=json.dumps(where) if where else "",
    )


def desired_json(spec: VMSpec, user_data: bytes = b"", meta_data: bytes = b"") -> str:
    """Reconfigure's payload: the whole create request; zero and null mean "no change"."""
    return json.dumps(
        {
            "Name": spec.name,
            "Class": vm_class(spec),
            "Image": vm_image(spec),
            "Networks": networks(spec.networks),
            "Disks": disks(spec.disks),
            "UserData": (
                {"CloudInitData": user_data.decode(), "Type": "cloud-init"} if user_data else None
            ),
            "MetaData": {"MetaDataYAML": meta_data.decode()} if meta_data else None,
            "Placement": placement(spec),
            "Tags": list(spec.tags) or None,
        }
    )


def clone_class_json(cpu: int, memory: str) -> str:
    """Clone's class: the VMClass CRD spec (camelCase, memory as a quantity)."""
    if not cpu and not memory:
        return ""
    spec: dict[str, Any] = {}
    if cpu:
        spec["cpu"] = cpu
    if memory:
        quantity_bytes(memory)  # refuse a bad size here, not on the provider
        spec["memory"] = memory
    return json.dumps(spec)


def customize_json(hostname: str, domain: str, time_zone: str, user_data: bytes) -> str:
    spec: dict[str, Any] = {}
    if hostname:
        spec["hostname"] = hostname
    if domain:
        spec["domain"] = domain
    if time_zone:
        spec["timeZone"] = time_zone
    if user_data:
        spec["userData"] = {"cloudInit": {"inline": user_data.decode()}}
    return json.dumps(spec) if spec else ""


def image_prepare_json(
    *, path: str, url: str, template: str, image_format: str, checksum: str, storage_pool: str
) -> str:
    """ImagePrepare's payload: the VMImage CRD spec's `source` (camelCase)."""
    if template:
        source: dict[str, Any] = {"vsphere": {"templateName": template}}
    elif path or url:
        libvirt = {"path": path, "url": url, "format": image_format, "storagePool": storage_pool}
        if checksum:
            libvirt.update(checksum=checksum, checksumType="sha256")
        source = {"libvirt": {key: value for key, value in libvirt.items() if value}}
    else:
        raise PayloadError("an image needs --path, --url or --template")
    return json.dumps({"source": source, "prepare": {}})
