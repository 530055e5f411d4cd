"""Storage pools and volumes: where VM disks are made, sized, copied and removed.

Later pieces (image download, cloud-init seed media) add their volumes here too.
"""

from __future__ import annotations

import secrets
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

import libvirt

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.errors import AdapterError, is_missing
from pyrigaud.domain.errors import ProviderError

GIB = 1024**3
VirStoragePool = Any
VirStorageVol = Any


@dataclass(frozen=True)
class VolumeFacts:
    path: str
    format: str
    capacity_bytes: int
    allocation_bytes: int
    backing_path: str


@dataclass(frozen=True)
class PoolSettings:
    """Which pool VMs land in when no placement names one, and where it goes if missing."""

    default_pool: str = "default"
    default_pool_path: str = "/var/lib/libvirt/images"


def find_pool(conn: VirConnect, name: str, settings: PoolSettings) -> VirStoragePool:
    """The named pool, active; only the default pool is created when it does not exist."""
    try:
        pool = conn.storagePoolLookupByName(name)
    except libvirt.libvirtError as error:
        if not is_missing(error):
            raise
        if name != settings.default_pool:
            raise AdapterError(
                ProviderError.invalid_spec(
                    "placement_json.Datastore", f"no storage pool named {name!r}"
                )
            ) from error
        pool = conn.storagePoolDefineXML(_dir_pool_xml(name, settings.default_pool_path), 0)
        pool.build(0)
        pool.setAutostart(1)
    if not pool.isActive():
        pool.create(0)
    return pool


def _dir_pool_xml(name: str, path: str) -> str:
    root = ET.Element("pool", {"type": "dir"})
    ET.SubElement(root, "name").text = name
    ET.SubElement(ET.SubElement(root, "target"), "path").text = path
    return ET.tostring(root, encoding="unicode")


def volume_name(vm_name: str, index: int) -> str:
    """Unique per attempt, so a crashed Create's leftover never blocks the retry."""
    return f"{vm_name}-disk{index}-{secrets.token_hex(4)}.qcow2"


def volume_xml(name: str, capacity_bytes: int, backing: VolumeFacts | None = None) -> str:
    """A thin qcow2 volume, optionally an overlay on `backing`."""
    root = ET.Element("volume")
    ET.SubElement(root, "name").text = name
    ET.SubElement(root, "capacity", {"unit": "bytes"}).text = str(capacity_bytes)
    ET.SubElement(root, "allocation", {"unit": "bytes"}).text = "0"
    ET.SubElement(ET.SubElement(root, "target"), "format", {"type": "qcow2"})
    if backing is not None:
        store = ET.SubElement(root, "backingStore")
        ET.SubElement(store, "path").text = backing.path
        ET.SubElement(store, "format", {"type": backing.format})
    return ET.tostring(root, encoding="unicode")


def create_volume(
    pool: VirStoragePool, name: str, capacity_bytes: int, backing: VolumeFacts | None = None
) -> str:
    return str(pool.createXML(volume_xml(name, capacity_bytes, backing), 0).path())


def copy_volume(conn: VirConnect, source_path: str, name: str) -> str:
    """A full copy of the volume at `source_path`, in the same pool."""
    source = conn.storageVolLookupByPath(source_path)
    pool = source.storagePoolLookupByVolume()
    capacity = int(source.info()[1])
    return str(pool.createXMLFrom(volume_xml(name, capacity), source, 0).path())


def volume_facts(conn: VirConnect, path: str) -> VolumeFacts | None:
    """The volume at `path`, or None when no pool knows it."""
    try:
        volume = conn.storageVolLookupByPath(path)
    except libvirt.libvirtError as error:
        if is_missing(error):
            return None
        raise
    _kind, capacity, allocation = volume.info()
    root = ET.fromstring(volume.XMLDesc(0))  # noqa: S314 - libvirt's own output
    target_format = root.find("target/format")
    return VolumeFacts(
        path=path,
        format=target_format.get("type", "raw") if target_format is not None else "raw",
        capacity_bytes=int(capacity),
        allocation_bytes=int(allocation),
        backing_path=root.findtext("backingStore/path", ""),
    )


def grow_volume(conn: VirConnect, path: str, capacity_bytes: int) -> None:
    conn.storageVolLookupByPath(path).resize(capacity_bytes, 0)


def delete_volume(conn: VirConnect, path: str) -> None:
    """Remove the volume at `path`; one that is already gone is fine."""
    try:
        conn.storageVolLookupByPath(path).delete(0)
    except libvirt.libvirtError as error:
        if not is_missing(error):
            raise
