"""A migrated guest's devices on a real QEMU: the nearest equivalents of its hardware start and
are what the running domain has (blank disks, no guest OS: whether a guest boots on them is
the guest variants' test); and the import record beside a landed disk is read back."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.storage import volume_xml
from pyrigaud.domain.disk_images import IMPORT_RECORD_SUFFIX
from pyrigaud.domain.hardware import DiskController, NicModel, VirtualHardware
from pyrigaud.domain.models import DiskSpec, NetworkAttachment, OwnerMark, VMChanges

from support import ok
from support.libvirt import create_vm
from support.qemu import QemuHost, ensure_test_pool

OWNER = OwnerMark(provider="tests/qemu-hardware")
TWO_NICS = (NetworkAttachment(), NetworkAttachment())


def started(qemu: QemuHost, conn: Any, name: str, hardware: VirtualHardware) -> ET.Element:
    """The live XML of a VM made for `hardware` and powered on."""
    request = qemu.request(name, image=qemu.image, hardware=hardware, networks=TWO_NICS)
    vm_id = ok(create_vm(qemu.backend, request, OWNER))
    ok(qemu.backend.power.power_on(vm_id))
    dom = conn.lookupByUUIDString(vm_id)
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    return ET.fromstring(dom.XMLDesc(0))


def root_disk(root: ET.Element) -> tuple[str, str]:
    target = root.find("devices/disk[@device='disk']/target")
    assert target is not None
    return target.get("dev", ""), target.get("bus", "")


def controllers(root: ET.Element, kind: str) -> list[str]:
    return [
        element.get("model", "") for element in root.iterfind(f"devices/controller[@type='{kind}']")
    ]


def nic_models(root: ET.Element) -> list[str]:
    return [model.get("type", "") for model in root.iterfind("devices/interface/model")]


@pytest.mark.parametrize(
    ("controller", "nics", "disk", "scsi", "models"),
    [
        (
            DiskController.PVSCSI,
            (NicModel.VMXNET3, NicModel.VMXNET3),
            ("sda", "scsi"),
            ["vmpvscsi"],
            ["vmxnet3", "vmxnet3"],
        ),
        (DiskController.SATA, (NicModel.E1000, NicModel.E1000), ("sda", "sata"), [], ["e1000"] * 2),
        (
            DiskController.LSI_LOGIC_SAS,
            (NicModel.E1000E, NicModel.PCNET),
            ("sda", "scsi"),
            ["lsisas1068"],
            ["e1000e", "pcnet"],
        ),
        (DiskController.IDE, (NicModel.RTL8139,), ("hda", "ide"), [], ["rtl8139"] * 2),
    ],
)
def test_a_guests_devices_start_on_qemu(
    qemu: QemuHost,
    conn: Any,
    controller: DiskController,
    nics: tuple[NicModel, ...],
    disk: tuple[str, str],
    scsi: list[str],
    models: list[str],
) -> None:
    hardware = VirtualHardware(
        source_hypervisor="vsphere", disk_controller=controller, nic_models=nics
    )
    root = started(qemu, conn, f"born-{controller.value}", hardware)
    assert root_disk(root) == disk
    assert controllers(root, "scsi") == scsi
    assert nic_models(root) == models
    if disk[1] == "sata":  # AHCI: q35's own, or one libvirt adds to an i440fx machine
        assert controllers(root, "sata")


def test_a_disk_is_hot_added_beside_a_running_pvscsi_root_disk(qemu: QemuHost, conn: Any) -> None:
    hardware = VirtualHardware(source_hypervisor="vsphere", disk_controller=DiskController.PVSCSI)
    request = qemu.request("grows", image=qemu.image, hardware=hardware)
    vm_id = ok(create_vm(qemu.backend, request, OWNER))
    ok(qemu.backend.power.power_on(vm_id))
    ok(qemu.backend.lifecycle.reconfigure(vm_id, VMChanges(disks=(DiskSpec(size_gib=1),))))
    for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE):  # live, and in the definition
        root = ET.fromstring(conn.lookupByUUIDString(vm_id).XMLDesc(flags))
        targets = [
            (target.get("dev"), target.get("bus"))
            for target in root.iterfind("devices/disk[@device='disk']/target")
        ]
        assert targets == [("sda", "scsi"), ("vdb", "virtio")]


def test_the_import_record_beside_a_disk_volume_is_read_back(qemu: QemuHost, conn: Any) -> None:
    pool = ensure_test_pool(conn)
    disk = pool.createXML(volume_xml("landed.qcow2", 1024**2), 0)
    record = b'{"kind": "an import record"}'
    kept = pool.createXML(
        volume_xml(f"landed.qcow2{IMPORT_RECORD_SUFFIX}", len(record), volume_format="raw"), 0
    )
    stream = conn.newStream(0)
    kept.upload(stream, 0, len(record), 0)
    stream.send(record)
    stream.finish()
    assert qemu.backend.hardware is not None
    assert ok(qemu.backend.hardware.import_record_of(str(disk.path()))) == record
