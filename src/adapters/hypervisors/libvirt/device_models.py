"""A guest's devices in libvirt's words and in the domain's (domain/hardware.py), both ways.

Read: what a domain's disk sits on and what its NICs are, for the export's hardware manifest
and for Describe. Made: Create from an imported disk gives its guest the nearest equivalent of
what it was born on (QEMU as Debian builds it emulates VMware's ParaVirtual SCSI, the LSI SAS
1068, AHCI, IDE, vmxnet3, the e1000s and the PCnet); where there is none the guest gets what it
most likely has a driver for, and that fallback is logged and counted, never refused. Only the
root disk (the imported one) and the NICs follow the guest; added disks and the cloud-init
seed keep pyrigaud's own devices. docs/migration.md says why each choice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyrigaud.adapters.hypervisors.libvirt.domain_xml import SAS_CONTROLLER, SCSI_BUS, DiskDevice
from pyrigaud.domain.hardware import DiskController, NicModel, VirtualHardware
from pyrigaud.domain.models import NetworkAttachment

logger = logging.getLogger(__name__)

SOURCE_HYPERVISOR = "libvirt"
NATIVE_BUS = "virtio"
NATIVE_NIC = "virtio"
DISK_CONTROLLER_DEVICE = "disk_controller"  # the fallback counter's device labels
NIC_DEVICE = "nic"

# libvirt's SCSI controller models, by the driver a guest needs for them.
_SCSI_CONTROLLERS = {
    "virtio-scsi": DiskController.VIRTIO_SCSI,
    "vmpvscsi": DiskController.PVSCSI,
    SAS_CONTROLLER: DiskController.LSI_LOGIC_SAS,
    # QEMU's `lsi` is the 53c895a (sym53c8xx), not the 53c1030 that vSphere's LSI Logic
    # presents (mptspi): the nearest word the domain has, not the same chip.
    "lsilogic": DiskController.LSI_LOGIC,
}
_BUSES = {
    "virtio": DiskController.VIRTIO_BLK,
    "sata": DiskController.SATA,
    "ide": DiskController.IDE,
    "nvme": DiskController.NVME,
}
# libvirt's interface models QEMU emulates, by the driver a guest needs for them.
_NICS = {
    "virtio": NicModel.VIRTIO,
    "virtio-transitional": NicModel.VIRTIO,
    "virtio-non-transitional": NicModel.VIRTIO,
    "vmxnet3": NicModel.VMXNET3,
    "e1000": NicModel.E1000,
    "e1000e": NicModel.E1000E,
    "rtl8139": NicModel.RTL8139,
    "pcnet": NicModel.PCNET,  # QEMU's Am79C970A: the chip vSphere's Flexible/vlance presents
}
# The same NIC on QEMU, by the model the guest was born with (VMware's vmxnet2 has none).
_SAME_NIC = {
    NicModel.VIRTIO: "virtio",
    NicModel.VMXNET3: "vmxnet3",
    NicModel.E1000: "e1000",
    NicModel.E1000E: "e1000e",
    NicModel.RTL8139: "rtl8139",
    NicModel.PCNET: "pcnet",
}

# (bus, SCSI controller model) of the same device on QEMU.
_EQUIVALENT_DISKS: dict[DiskController, tuple[str, str]] = {
    DiskController.VIRTIO_BLK: (NATIVE_BUS, ""),
    DiskController.VIRTIO_SCSI: (SCSI_BUS, "virtio-scsi"),
    DiskController.PVSCSI: (SCSI_BUS, "vmpvscsi"),
    DiskController.LSI_LOGIC_SAS: (SCSI_BUS, SAS_CONTROLLER),
    DiskController.SATA: ("sata", ""),
    DiskController.IDE: ("ide", ""),
}
# vSphere's LSI Logic parallel (the 53c1030, mptspi) has no QEMU model: the LSI SAS 1068's
# mptsas is the same Fusion-MPT driver family, which generic initramfs images carry whole.
_LSI_LOGIC_NEAREST = (SCSI_BUS, SAS_CONTROLLER)
# AHCI: the storage driver generic initramfs images and Windows ship, and q35's own.
_ANY_GUEST_DISK = ("sata", "")
_ANY_GUEST_NIC = "e1000"  # Intel's PRO/1000: a driver every OS ships


def disk_controller_of(disk: DiskDevice) -> DiskController | None:
    """The domain's word for what `disk` sits on; None for a bus or model it has none for."""
    if disk.bus == SCSI_BUS:
        return _SCSI_CONTROLLERS.get(disk.controller)
    return _BUSES.get(disk.bus)


def nic_model_of(model: str) -> NicModel | None:
    return _NICS.get(model)


def shown_disk_controller(disk: DiskDevice) -> str:
    """For Describe: the domain's word, else libvirt's own (`scsi/<model>`, the bus)."""
    known = disk_controller_of(disk)
    if known is not None:
        return known.value
    return f"{disk.bus}/{disk.controller}" if disk.controller else disk.bus


def shown_nic_model(model: str) -> str:
    known = nic_model_of(model)
    return known.value if known is not None else model


@dataclass(frozen=True)
class Fallback:
    """A device the guest gets although it was not known to have its driver."""

    device: str  # DISK_CONTROLLER_DEVICE or NIC_DEVICE
    guest_had: str
    given: str
    nic: int = -1  # which NIC, by position


@dataclass(frozen=True)
class GuestDevices:
    """What the root disk sits on and what each NIC is; NICs past `nic_models` (more networks
    than the guest had NICs) get `other_nics`."""

    disk_bus: str = NATIVE_BUS
    scsi_controller: str = ""
    nic_models: tuple[str, ...] = ()
    other_nics: str = NATIVE_NIC
    fallbacks: tuple[Fallback, ...] = ()

    def nic_model(self, index: int) -> str:
        return self.nic_models[index] if index < len(self.nic_models) else self.other_nics

    def fallbacks_made(self, nics: tuple[NetworkAttachment, ...]) -> tuple[Fallback, ...]:
        """The fallbacks of a VM made with `nics`: a NIC's counts only if the VM has that NIC
        and its model came from here (the request named none)."""
        return tuple(
            fallback
            for fallback in self.fallbacks
            if fallback.device != NIC_DEVICE
            or (fallback.nic < len(nics) and not nics[fallback.nic].model)
        )


NATIVE = GuestDevices()


def nearest_devices(hardware: VirtualHardware | None, *, has_ide: bool) -> GuestDevices:
    """The devices a guest born on `hardware` gets here (None: libvirt's native virtio);
    `has_ide`: the machine has an IDE controller (i440fx does, q35 does not)."""
    if hardware is None:
        return NATIVE
    fallbacks: list[Fallback] = []
    wanted = hardware.disk_controller
    exact = _EQUIVALENT_DISKS.get(wanted) if wanted is not None else None
    if wanted is DiskController.IDE and not has_ide:
        exact = None
    if wanted is DiskController.LSI_LOGIC and hardware.source_hypervisor == SOURCE_HYPERVISOR:
        exact = (SCSI_BUS, "lsilogic")  # born on QEMU's own lsi: the same chip again
    if exact is None:
        exact = _nearest_disk(wanted, has_ide=has_ide)
        fallbacks.append(Fallback(DISK_CONTROLLER_DEVICE, _named(wanted), _disk_named(*exact)))
    bus, scsi_controller = exact
    nics = []
    for index, model in enumerate(hardware.nic_models):
        same = _SAME_NIC.get(model) if model is not None else None
        if same is None:
            fallbacks.append(Fallback(NIC_DEVICE, _named(model), _ANY_GUEST_NIC, index))
        nics.append(same or _ANY_GUEST_NIC)
    return GuestDevices(
        disk_bus=bus,
        scsi_controller=scsi_controller,
        nic_models=tuple(nics),
        # A NIC the guest never had: the model of its first, whose driver it has.
        other_nics=nics[0] if nics else _ANY_GUEST_NIC,
        fallbacks=tuple(fallbacks),
    )


def _nearest_disk(wanted: DiskController | None, *, has_ide: bool) -> tuple[str, str]:
    """No equivalent here: LSI Logic parallel gets the LSI SAS 1068 (docs/migration.md);
    BusLogic, a controller of old guests, gets IDE, which they all know, where the machine
    has it; anything else (NVMe: this libvirt has no NVMe disk bus) gets AHCI."""
    if wanted is DiskController.LSI_LOGIC:
        return _LSI_LOGIC_NEAREST
    if wanted is DiskController.BUSLOGIC and has_ide:
        return ("ide", "")
    return _ANY_GUEST_DISK


def _named(device: DiskController | NicModel | None) -> str:
    return device.value if device is not None else "a device of unknown model"


def _disk_named(bus: str, scsi_controller: str) -> str:
    return f"{bus} ({scsi_controller})" if scsi_controller else bus


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class FallbackCounts:
    """The fallback counters (pyrigaud_hardware_fallbacks, by device), taken at build time."""

    disk_controller: Callable[[], None] = _nothing
    nic: Callable[[], None] = _nothing

    def report(self, vm_name: str, fallbacks: tuple[Fallback, ...]) -> None:
        """Each fallback of a VM just made: a warning naming what its guest had, and a count."""
        for fallback in fallbacks:
            logger.warning(
                "VM %s: its guest was born with %s %s, which has no equivalent here; it gets "
                "%s instead, which it may lack a driver for",
                vm_name,
                "the disk controller" if fallback.device == DISK_CONTROLLER_DEVICE else "a NIC",
                fallback.guest_had,
                fallback.given,
            )
            count = self.disk_controller if fallback.device == DISK_CONTROLLER_DEVICE else self.nic
            count()
