"""The virtual hardware a guest boots on, in words no hypervisor owns.

A guest carries drivers only for the hardware it was installed on: a host-only initramfs born
on vSphere holds `vmw_pvscsi` or `mptsas`, not `virtio_blk`; Windows boots only from a
controller whose driver is boot-start. So a migrated disk travels with what its guest knows
(`VirtualHardware`, written beside the staged disk as its hardware manifest), and the target
makes the nearest equivalent it has. Each backend maps these words to its own device models;
the domain only names them.
"""

from __future__ import annotations

from enum import StrEnum

from pyrigaud.domain.values import Value


class Firmware(StrEnum):
    BIOS = "BIOS"
    UEFI = "UEFI"


class DiskController(StrEnum):
    """How the guest reaches its disk: the controller (or bus) and its model, as the guest's
    kernel sees it (each value names one driver a guest may or may not have)."""

    VIRTIO_BLK = "virtio-blk"
    VIRTIO_SCSI = "virtio-scsi"
    PVSCSI = "pvscsi"  # VMware ParaVirtual SCSI (vmw_pvscsi)
    LSI_LOGIC = "lsilogic"  # LSI Logic parallel, the 53c1030 (mptspi)
    LSI_LOGIC_SAS = "lsisas1068"  # LSI Logic SAS, the SAS 1068 (mptsas)
    BUSLOGIC = "buslogic"
    SATA = "sata"  # AHCI
    IDE = "ide"
    NVME = "nvme"


class NicModel(StrEnum):
    """A network card's model, as the guest's driver knows it."""

    VIRTIO = "virtio"
    VMXNET3 = "vmxnet3"
    VMXNET2 = "vmxnet2"
    E1000 = "e1000"
    E1000E = "e1000e"
    RTL8139 = "rtl8139"
    PCNET = "pcnet"  # AMD PCnet32, vSphere's "flexible"/"vlance"


class VirtualHardware(Value):
    """What a guest boots on: its firmware, how it reaches the exported disk, its NICs in
    order. `machine_type` and `guest_os` are what the source hypervisor calls them (libvirt's
    machine and libosinfo id; vSphere's hardware version and guestId), kept for whoever can
    use them; "" or None where unknown."""

    source_hypervisor: str
    firmware: Firmware = Firmware.BIOS
    secure_boot: bool = False
    disk_controller: DiskController | None = None
    nic_models: tuple[NicModel | None, ...] = ()
    machine_type: str = ""
    guest_os: str = ""


class BootNeed(StrEnum):
    """What firmware a disk can boot by, judged from its first sectors."""

    UEFI_ONLY = "uefi-only"  # a GPT with an EFI system partition and no BIOS boot code
    BIOS = "bios"  # BIOS boot code or a BIOS boot partition: the class's firmware is kept
    UNKNOWN = "unknown"  # not judged (no partition table, or the sectors were not seen)
