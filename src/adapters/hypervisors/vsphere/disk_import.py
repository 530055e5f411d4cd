"""A streamOptimized VMDK landed on a datastore as a plain disk file, the way vCenter's own
tools (and upstream's provider) do it: vCenter accepts disk bytes only through an NFC import
lease, which belongs to a VM being imported. So a transient VM is imported from a one-disk OVF
(thin), the bytes go through its lease, and once the lease completes the disk is detached
(its file kept) and the VM unregistered: what stays is `[ds] <name>/` holding the disk, which
Create then builds a VM around (disk_vm.py).

A failed import leaves nothing: the lease is aborted, the transient VM destroyed and its home
folder deleted before the failure is returned (or vCenter's fault raised on to the edge). Only
a folder this import's VM lives in is deleted: an import that fails before its VM exists
leaves `[ds] <name>` alone, since another import of that name (another replica's) may have
made it meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import IO, Any, BinaryIO
from xml.etree import ElementTree as ET

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure, undone_on_raise
from pyrigaud.adapters.hypervisors.vsphere import datastore_files
from pyrigaud.adapters.hypervisors.vsphere.calls import best_effort
from pyrigaud.adapters.hypervisors.vsphere.ovf_import import import_spec, import_vm
from pyrigaud.adapters.hypervisors.vsphere.placement import Location
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve
from pyrigaud.adapters.hypervisors.vsphere.session import Connection
from pyrigaud.adapters.hypervisors.vsphere.tasks import destroyed, wait
from pyrigaud.domain.errors import ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

OVF = "http://schemas.dmtf.org/ovf/envelope/1"
RASD = "http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData"
VSSD = "http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData"
STREAM_OPTIMIZED = "http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"
DISK_HREF = "disk.vmdk"

for prefix, namespace in (("ovf", OVF), ("rasd", RASD), ("vssd", VSSD)):
    ET.register_namespace(prefix, namespace)


def import_stream_optimized(  # noqa: PLR0917 (the signature the ImportDisk glue calls)
    connection: Connection,
    vmdk: BinaryIO,
    size_bytes: int,
    name: str,
    location: Location,
    capacity_bytes: int,
    *,
    marks: Mapping[str, str],
) -> Result[str, ProviderError]:
    """Upload `vmdk` (a streamOptimized VMDK of `size_bytes` bytes, read from its start) as a
    disk of `capacity_bytes` in `[ds] <name>/` on the location's datastore; its datastore
    path. ALREADY_EXISTS when that folder exists (it is left alone). The transient VM carries
    `marks` (the building mark lets the leftover sweep remove one a killed provider left)."""
    disk = _OneDisk(vmdk, size_bytes)
    datastore = str(retrieve(connection, [location.datastore], ("name",))[0]["name"])
    folder = f"[{datastore}] {name}"

    def unclaimed(taken: bool) -> Result[None, ProviderError]:
        if taken:
            return Failure(
                ProviderError.already_exists(f"datastore {datastore!r} already holds {name!r}")
            )
        return Success(None)

    descriptor = one_disk_descriptor(name, disk.size_bytes, capacity_bytes)

    def spec(_unclaimed: None) -> Result[Any, ProviderError]:
        return import_spec(connection, descriptor, name, location, _refused)

    # A failure inside import_vm aborts the lease and destroys the VM it was making, with its
    # home folder. One before the VM exists (another import of that name got there between
    # the check and now) leaves everything alone: that folder is the other import's.
    return (
        datastore_files.exists(connection, folder)
        .bind(unclaimed)
        .bind(spec)
        .bind(partial(import_vm, connection, disk, location=location, marks=marks))
        .bind(partial(_kept, connection, folder=folder, datastore=datastore, name=name))
    )


def _kept(
    connection: Connection, vm: Any, folder: str, datastore: str, name: str
) -> Result[str, ProviderError]:
    """The imported VM's disk kept in `folder` and the VM gone; whatever fails on the way
    takes the VM (and, once the disk is detached, its folder) away."""
    home = undone_on_raise(partial(_home_folder, connection, vm), partial(_destroy, connection, vm))
    if home != folder:  # the folder appeared meanwhile, and vCenter made ours beside it
        _destroy(connection, vm)
        return Failure(
            ProviderError.already_exists(
                f"datastore {datastore!r} already holds {name!r}: another import of that "
                "name made it meanwhile"
            )
        )
    return undone_on_failure(
        partial(_keep_disk, connection, vm), partial(_forget, connection, vm, home)
    )


def _home_folder(connection: Connection, vm: Any) -> str:
    """The datastore folder the VM was made in: `[ds] folder` of its `.vmx`."""
    row = retrieve(connection, [vm], ("config.files.vmPathName",))[0]
    return datastore_files.folder_of(str(row["config.files.vmPathName"]))


def _destroy(connection: Connection, vm: Any) -> None:
    """Destroy the import's VM if it is still there; the caller's failure is the one told (so
    this cleanup's own is not)."""
    best_effort(partial(destroyed, connection, vm))


def _forget(connection: Connection, vm: Any, home: str) -> None:
    """Once detached the disk is no longer the VM's: only deleting the VM's home folder,
    where the disk was made, takes it away."""
    _destroy(connection, vm)
    best_effort(partial(datastore_files.delete, connection, home))


def one_disk_descriptor(name: str, size_bytes: int, capacity_bytes: int) -> str:
    """The OVF of a VM with one streamOptimized disk on an LSI Logic controller. It has a
    <System> element: vCenter tolerates none, the simulator's CreateImportSpec does not."""
    envelope = ET.Element(_ovf("Envelope"))
    references = _child(envelope, _ovf("References"))
    _child(
        references,
        _ovf("File"),
        attributes={_ovf("id"): "file1", _ovf("href"): DISK_HREF, _ovf("size"): str(size_bytes)},
    )
    disks = _child(envelope, _ovf("DiskSection"))
    _child(disks, _ovf("Info"), "The imported disk")
    _child(
        disks,
        _ovf("Disk"),
        attributes={
            _ovf("diskId"): "disk1",
            _ovf("fileRef"): "file1",
            _ovf("capacity"): str(capacity_bytes),
            _ovf("format"): STREAM_OPTIMIZED,
        },
    )
    system = _child(envelope, _ovf("VirtualSystem"), attributes={_ovf("id"): "vm"})
    _child(system, _ovf("Info"), "A transient VM carrying the imported disk")
    _child(system, _ovf("Name"), name)
    os_section = _child(system, _ovf("OperatingSystemSection"), attributes={_ovf("id"): "101"})
    _child(os_section, _ovf("Info"), "Linux 64-bit")
    hardware = _child(system, _ovf("VirtualHardwareSection"))
    _child(hardware, _ovf("Info"), "Virtual hardware")
    settings = _child(hardware, _ovf("System"))
    for tag, text in (
        ("ElementName", "Virtual Hardware Family"),
        ("InstanceID", "0"),
        ("VirtualSystemIdentifier", name),
        ("VirtualSystemType", "vmx-10"),
    ):
        _child(settings, f"{{{VSSD}}}{tag}", text)
    # Each item's rasd elements in the schema's (alphabetical) order.
    for item in (
        {"ElementName": "1 virtual CPU", "InstanceID": "1", "ResourceType": "3",
         "VirtualQuantity": "1"},
        {"AllocationUnits": "byte * 2^20", "ElementName": "128 MB of memory", "InstanceID": "2",
         "ResourceType": "4", "VirtualQuantity": "128"},
        {"Address": "0", "ElementName": "SCSI controller 0", "InstanceID": "3",
         "ResourceSubType": "lsilogic", "ResourceType": "6"},
        {"AddressOnParent": "0", "ElementName": "Hard disk 1", "HostResource": "ovf:/disk/disk1",
         "InstanceID": "4", "Parent": "3", "ResourceType": "17"},
    ):  # fmt: skip
        element = _child(hardware, _ovf("Item"))
        for tag, text in sorted(item.items()):
            _child(element, f"{{{RASD}}}{tag}", text)
    return ET.tostring(envelope, encoding="unicode", xml_declaration=True)


@dataclass(frozen=True)
class _OneDisk:
    """The one file the descriptor references: the caller's VMDK (theirs to close)."""

    reader: BinaryIO
    size_bytes: int

    def size(self, href: str) -> Result[int, ProviderError]:
        return Success(self.size_bytes)

    @contextlib.contextmanager
    def _opened(self) -> Iterator[IO[bytes]]:
        self.reader.seek(0)
        yield self.reader

    def open(self, href: str) -> Result[AbstractContextManager[IO[bytes]], ProviderError]:
        return Success(self._opened())


def _keep_disk(connection: Connection, vm: Any) -> Result[str, ProviderError]:
    """Detach the imported VM's disk without deleting its file, unregister the VM, and
    return the disk's datastore path."""
    row = retrieve(connection, [vm], ("config.hardware.device",))[0]
    devices = row.get("config.hardware.device")
    disks = [d for d in devices or () if isinstance(d, vim.vm.device.VirtualDisk)]
    if len(disks) != 1:
        return Failure(
            ProviderError.failed_precondition(
                f"the disk import made a VM with {len(disks)} disks, not 1"
            )
        )
    # No fileOperation: the device goes, the file stays.
    removal = vim.vm.device.VirtualDeviceSpec(operation="remove", device=disks[0])

    def unregistered(_: object) -> str:
        vm.UnregisterVM()
        return str(disks[0].backing.fileName)

    return wait(connection, vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=[removal]))).map(
        unregistered
    )


def _refused(problems: str) -> ProviderError:
    """vCenter refusing the descriptor this module wrote from a judged image: the target (its
    datastore, its pool) cannot take the disk as it stands."""
    return ProviderError.failed_precondition(f"vCenter refuses the disk import's OVF: {problems}")


def _ovf(tag: str) -> str:
    return f"{{{OVF}}}{tag}"


def _child(
    parent: ET.Element, tag: str, text: str | None = None, attributes: dict[str, str] | None = None
) -> ET.Element:
    element = ET.SubElement(parent, tag, attributes or {})
    element.text = text
    return element
