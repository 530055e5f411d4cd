"""A migrated guest's hardware on libvirt's test driver: Create makes the nearest equivalent in
the domain's XML, HardwareFacts reads a domain's hardware back, Describe shows the devices."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.device_models import (
    DISK_CONTROLLER_DEVICE,
    NIC_DEVICE,
    FallbackCounts,
)
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports.virtual_hardware import HardwareFacts
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.hardware import DiskController, Firmware, NicModel, VirtualHardware
from pyrigaud.domain.models import (
    CreateRequest,
    DiskSpec,
    NetworkAttachment,
    OwnerMark,
    VMClass,
)

from support import ManualClock, error_of, ok
from support.libvirt import create_vm, isolated_host_uri, make_backend, write_pool_file

OWNER = OwnerMark(provider="tests/libvirt-hardware")
FROM_VSPHERE_PVSCSI = VirtualHardware(
    source_hypervisor="vsphere",
    disk_controller=DiskController.PVSCSI,
    nic_models=(NicModel.VMXNET3, NicModel.E1000),
)


class Host:
    def __init__(self, tmp_path: Path) -> None:
        self.counted: list[str] = []
        counts = FallbackCounts(
            disk_controller=lambda: self.counted.append(DISK_CONTROLLER_DEVICE),
            nic=lambda: self.counted.append(NIC_DEVICE),
        )
        self.backend: Backend
        self.connection: LibvirtConnection
        self.backend, self.connection = make_backend(
            isolated_host_uri(tmp_path),
            ManualClock(),
            volume_writer=write_pool_file,
            hardware_fallbacks=counts,
        )

    @property
    def hardware(self) -> HardwareFacts:
        assert self.backend.hardware is not None
        return self.backend.hardware

    def create(self, name: str, **changes: object) -> str:
        request = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256))
        return ok(create_vm(self.backend, request.model_copy(update=changes), OWNER))

    def xml(self, vm_id: str) -> ET.Element:
        text = ok(
            self.connection.call(
                lambda conn: conn.lookupByUUIDString(vm_id).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            )
        )
        return ET.fromstring(text)

    def define(self, xml: str) -> str:
        return str(ok(self.connection.call(lambda conn: conn.defineXML(xml).UUIDString())))


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    made = Host(tmp_path)
    yield made
    made.connection.close()


def disks(root: ET.Element) -> list[tuple[str, str, str]]:
    """(device, target, bus) of every disk and cdrom, in order."""
    return [
        (disk.get("device", ""), target.get("dev", ""), target.get("bus", ""))
        for disk in root.iterfind("devices/disk")
        if (target := disk.find("target")) is not None
    ]


def scsi_models(root: ET.Element) -> list[str]:
    return [
        controller.get("model", "")
        for controller in root.iterfind("devices/controller[@type='scsi']")
    ]


def nic_models(root: ET.Element) -> list[str]:
    return [model.get("type", "") for model in root.iterfind("devices/interface/model")]


def test_without_hardware_everything_stays_on_virtio(host: Host) -> None:
    vm_id = host.create("native", disks=(DiskSpec(size_gib=1),))
    root = host.xml(vm_id)
    assert disks(root) == [("disk", "vda", "virtio"), ("disk", "vdb", "virtio")]
    assert scsi_models(root) == []
    assert nic_models(root) == ["virtio"]
    assert host.counted == []


def test_a_pvscsi_guest_gets_pvscsi_and_its_nics_while_added_disks_and_the_seed_keep_ours(
    host: Host,
) -> None:
    networks = (NetworkAttachment(network_name="lan"),) * 3
    vm_id = host.create(
        "from-vsphere",
        hardware=FROM_VSPHERE_PVSCSI,
        networks=networks,
        disks=(DiskSpec(size_gib=1),),
        user_data=b"#cloud-config\n",
    )
    root = host.xml(vm_id)
    # The seed cdrom moves to the next SATA name: the root disk holds sda.
    assert disks(root) == [
        ("disk", "sda", "scsi"),
        ("disk", "vdb", "virtio"),
        ("cdrom", "sdb", "sata"),
    ]
    assert scsi_models(root) == ["vmpvscsi"]
    # A third NIC the guest never had gets the model of its first.
    assert nic_models(root) == ["vmxnet3", "e1000", "vmxnet3"]
    assert host.counted == []


def test_a_nic_model_the_request_names_wins(host: Host) -> None:
    networks = (NetworkAttachment(model="virtio"), NetworkAttachment())
    vm_id = host.create("named-nic", hardware=FROM_VSPHERE_PVSCSI, networks=networks)
    assert nic_models(host.xml(vm_id)) == ["virtio", "e1000"]


@pytest.mark.parametrize(
    ("controller", "expected_disk", "expected_scsi"),
    [
        (DiskController.SATA, ("disk", "sda", "sata"), []),
        (DiskController.IDE, ("disk", "hda", "ide"), []),  # the test driver's machine is no q35
        (DiskController.LSI_LOGIC_SAS, ("disk", "sda", "scsi"), ["lsisas1068"]),
    ],
)
def test_the_root_disk_follows_its_guests_controller(
    host: Host,
    controller: DiskController,
    expected_disk: tuple[str, str, str],
    expected_scsi: list[str],
) -> None:
    hardware = VirtualHardware(source_hypervisor="vsphere", disk_controller=controller)
    root = host.xml(host.create("follows", hardware=hardware))
    assert disks(root)[0] == expected_disk
    assert scsi_models(root) == expected_scsi
    # A disk on the SAS controller has a world wide name (Linux's mptsas needs one); no other.
    names = [wwn.text or "" for wwn in root.iter("wwn")]
    if controller is DiskController.LSI_LOGIC_SAS:
        (name,) = names
        assert re.fullmatch(r"0x5[0-9a-f]{15}", name), name
    else:
        assert names == []


def test_fallbacks_are_made_and_counted_never_refused(host: Host) -> None:
    hardware = VirtualHardware(
        source_hypervisor="vsphere",
        disk_controller=DiskController.NVME,
        nic_models=(NicModel.VMXNET2, None),
    )
    networks = (NetworkAttachment(network_name="lan"),) * 2
    root = host.xml(host.create("fallen-back", hardware=hardware, networks=networks))
    assert disks(root)[0] == ("disk", "sda", "sata")
    assert nic_models(root) == ["e1000", "e1000"]
    assert host.counted == [DISK_CONTROLLER_DEVICE, NIC_DEVICE, NIC_DEVICE]


def test_describe_shows_the_devices_in_use(host: Host) -> None:
    networks = (NetworkAttachment(), NetworkAttachment())
    vm_id = host.create("described", hardware=FROM_VSPHERE_PVSCSI, networks=networks)
    description = ok(host.backend.inventory.describe(vm_id))
    assert description is not None
    assert description.raw["disk_controller"] == "pvscsi"
    assert description.raw["nic_models"] == "vmxnet3,e1000"
    native = ok(host.backend.inventory.describe(host.create("native")))
    assert native is not None
    assert (native.raw["disk_controller"], native.raw["nic_models"]) == ("virtio-blk", "virtio")


def test_hardware_made_for_a_guest_reads_back_the_same(host: Host) -> None:
    vm_id = host.create(
        "round-trip", hardware=FROM_VSPHERE_PVSCSI, networks=(NetworkAttachment(),) * 2
    )
    read = ok(host.hardware.hardware_of(vm_id, ""))
    assert read.source_hypervisor == "libvirt"
    assert (read.firmware, read.secure_boot) == (Firmware.BIOS, False)
    assert read.disk_controller is DiskController.PVSCSI
    assert read.nic_models == (NicModel.VMXNET3, NicModel.E1000)


EFI_DOMAIN = """<domain type='test'><name>{name}</name><memory>131072</memory>
<metadata><libosinfo:libosinfo xmlns:libosinfo="http://libosinfo.org/xmlns/libvirt/domain/1.0">
<libosinfo:os id="http://debian.org/debian/12"/></libosinfo:libosinfo></metadata>
<os{firmware}><type machine='pc-q35-7.2'>hvm</type>{secure}</os>
<devices>
<controller type='scsi' index='0' model='lsilogic'/>
<disk type='file' device='disk'><source file='/pool/boot.qcow2'/>
<target dev='vda' bus='virtio'/></disk>
<disk type='file' device='disk'><source file='/pool/data.qcow2'/>
<target dev='sda' bus='scsi'/></disk>
<interface type='user'><model type='e1000e'/></interface>
<interface type='user'><model type='ne2k_pci'/></interface>
</devices></domain>"""


@pytest.mark.parametrize(
    ("firmware", "secure"),
    [
        (" firmware='efi'", "<firmware><feature enabled='yes' name='secure-boot'/></firmware>"),
        ("", "<loader type='pflash' secure='yes' readonly='yes'>/ovmf/CODE.secboot.fd</loader>"),
    ],
)
def test_a_domains_firmware_os_machine_and_chosen_disk_are_read(
    host: Host, firmware: str, secure: str
) -> None:
    vm_id = host.define(EFI_DOMAIN.format(name="uefi", firmware=firmware, secure=secure))
    read = ok(host.hardware.hardware_of(vm_id, "sda"))
    assert read == VirtualHardware(
        source_hypervisor="libvirt",
        firmware=Firmware.UEFI,
        secure_boot=True,
        # QEMU's lsi (the 53c895a), in the nearest word the domain has.
        disk_controller=DiskController.LSI_LOGIC,
        nic_models=(NicModel.E1000E, None),
        machine_type="pc-q35-7.2",
        guest_os="http://debian.org/debian/12",
    )
    first = ok(host.hardware.hardware_of(vm_id, ""))
    assert first.disk_controller is DiskController.VIRTIO_BLK


def test_a_bios_domain_without_secure_boot_reads_as_such(host: Host) -> None:
    vm_id = host.define(EFI_DOMAIN.format(name="bios", firmware="", secure=""))
    read = ok(host.hardware.hardware_of(vm_id, "/pool/data.qcow2"))
    assert (read.firmware, read.secure_boot, read.guest_os) == (
        Firmware.BIOS,
        False,
        "http://debian.org/debian/12",
    )


def test_an_unknown_disk_or_vm_is_not_found(host: Host) -> None:
    vm_id = host.create("one-disk")
    assert error_of(host.hardware.hardware_of(vm_id, "vdz")).kind is ErrorKind.NOT_FOUND
    missing = "00000000-0000-0000-0000-000000000000"
    assert error_of(host.hardware.hardware_of(missing, "")).kind is ErrorKind.NOT_FOUND


def test_a_disk_without_an_import_record_has_none(host: Host) -> None:
    vm_id = host.create("not-imported")
    (path,) = [source.get("file", "") for source in host.xml(vm_id).iterfind("devices/disk/source")]
    assert ok(host.hardware.import_record_of(path)) is None
    assert ok(host.hardware.import_record_of("/no/such/volume.qcow2")) is None
