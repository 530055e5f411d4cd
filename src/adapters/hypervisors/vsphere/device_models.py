"""A guest's devices in vSphere's classes and in the domain's words, both ways: the controller
its disk hangs on and its NICs, read off a VM (the export's hardware manifest, Describe) and
chosen for a VM made around a migrated disk (Create).

vSphere has no virtio. A guest born on KVM (virtio-blk or virtio-scsi, virtio NICs) is given
what it most likely has drivers for:

- its disk on the VM's IDE controller (vSphere's is an Intel PIIX4, driven by Linux's
  `ata_piix`). dracut, the initramfs builder of Fedora, RHEL and their kin, installs
  `ata_piix` even in a host-only initramfs, whatever the host's own controllers (AHCI only
  when the host had it loaded: a q35 guest yes, an i440fx one no); Debian's and Ubuntu's
  initramfs-tools take every storage driver by default; Windows keeps its IDE drivers
  (`atapi`, `intelide`, `pciide`) boot-start, so it boots from IDE without virtio-win's.
- its NICs as Intel e1000e (82574L): `e1000e` is in every distribution's kernel, and Windows
  has it inbox from Windows 8 and Server 2012 (vmxnet3 needs VMware Tools there).

A device with no equivalent is a fallback: said in a warning, counted, never refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyVmomi import vim as untyped_vim

from pyrigaud.domain.hardware import DiskController, NicModel, VirtualHardware
from pyrigaud.domain.models import NetworkAttachment

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

CONTROLLER_CLASSES: Mapping[DiskController, Any] = {
    DiskController.PVSCSI: vim.vm.device.ParaVirtualSCSIController,
    DiskController.LSI_LOGIC_SAS: vim.vm.device.VirtualLsiLogicSASController,
    DiskController.LSI_LOGIC: vim.vm.device.VirtualLsiLogicController,
    DiskController.BUSLOGIC: vim.vm.device.VirtualBusLogicController,
    DiskController.SATA: vim.vm.device.VirtualAHCIController,
    DiskController.IDE: vim.vm.device.VirtualIDEController,
    DiskController.NVME: vim.vm.device.VirtualNVMEController,
}
NIC_CLASSES: Mapping[NicModel, Any] = {
    NicModel.VMXNET3: vim.vm.device.VirtualVmxnet3,
    NicModel.E1000: vim.vm.device.VirtualE1000,
    NicModel.E1000E: vim.vm.device.VirtualE1000e,
    NicModel.VMXNET2: vim.vm.device.VirtualVmxnet2,
    NicModel.PCNET: vim.vm.device.VirtualPCNet32,
}
FALLBACK_CONTROLLER = DiskController.IDE
FALLBACK_NIC = NicModel.E1000E
UNKNOWN = "unknown"  # Describe's word for a device with none in the domain's vocabulary


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class FallbackCounters:
    """Told once per VM given a fallback disk controller, once per VM given fallback NICs
    (pyrigaud_hardware_fallbacks_total by device)."""

    disk_controller: Callable[[], None] = _nothing
    nic: Callable[[], None] = _nothing


def controller_word(device: Any) -> DiskController | None:
    """The domain's word for a controller device; None for one it has no word for."""
    for word, kind in CONTROLLER_CLASSES.items():
        if isinstance(device, kind):
            return word
    return None


def nic_word(device: Any) -> NicModel | None:
    for word, kind in NIC_CLASSES.items():
        if isinstance(device, kind):
            return word
    return None


def controller_of(disk: Any, devices: Sequence[Any]) -> DiskController | None:
    """The word for the controller `disk` hangs on."""
    for device in devices:
        if device.key == disk.controllerKey:
            return controller_word(device)
    return None


def nic_words(devices: Sequence[Any]) -> tuple[NicModel | None, ...]:
    """The NICs' models in device order."""
    return tuple(
        nic_word(device)
        for device in devices
        if isinstance(device, vim.vm.device.VirtualEthernetCard)
    )


def shown_models(devices: Sequence[Any]) -> tuple[str, str]:
    """What Describe shows: the first disk's controller and the NICs' models, comma-joined,
    "unknown" for a device without a word ("" for no disk)."""
    disks = [device for device in devices if isinstance(device, vim.vm.device.VirtualDisk)]
    controller = (controller_of(disks[0], devices) or UNKNOWN) if disks else ""
    return str(controller), ",".join(str(word or UNKNOWN) for word in nic_words(devices))


class GuestDevices(NamedTuple):
    """The devices a VM around a migrated disk gets: its disk's controller (and, when the
    guest's had no equivalent, what it was), and NICs after the guest's own."""

    controller: DiskController
    controller_fallback: str  # "" or the guest's controller, in words, when it had none
    guest_nics: tuple[NicModel | None, ...]  # as the guest had them

    def nic_model(self, index: int) -> NicModel | None:
        """The model of the VM's `index`th NIC: the nearest equivalent of the guest's NIC
        there, of its last one beyond them; None when it had none (the default model)."""
        if not self.guest_nics:
            return None
        return nearest_nic(self.guest_nics[min(index, len(self.guest_nics) - 1)])

    def nic_fallbacks(self, networks: Sequence[NetworkAttachment]) -> tuple[str, ...]:
        """What the guest had, in words, at each place where a NIC is made (an attachment
        naming no model of its own) and its NIC had no equivalent."""
        return tuple(
            str(had or UNKNOWN)
            for had, attachment in zip(self.guest_nics, networks, strict=False)
            if not attachment.model and nearest_nic(had) != had
        )


def nearest_nic(model: NicModel | None) -> NicModel:
    return model if model is not None and model in NIC_CLASSES else FALLBACK_NIC


def guest_devices(hardware: VirtualHardware) -> GuestDevices:
    """vSphere's nearest equivalent of what the guest boots on."""
    had = hardware.disk_controller
    controller = had if had is not None and had in CONTROLLER_CLASSES else FALLBACK_CONTROLLER
    return GuestDevices(
        controller=controller,
        controller_fallback="" if controller == had else str(had or UNKNOWN),
        guest_nics=hardware.nic_models,
    )
