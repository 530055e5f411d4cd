"""HardwareFacts on vSphere: what a VM's guest boots on, read in one property-collector round
trip for the export's manifest, and the record an import kept beside a datastore disk."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.vsphere import datastore_files
from pyrigaud.adapters.hypervisors.vsphere.calls import run
from pyrigaud.adapters.hypervisors.vsphere.device_models import controller_of, nic_words
from pyrigaud.adapters.hypervisors.vsphere.disk_landing import record_path
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import disk_index, virtual_disks
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import Firmware, VirtualHardware

SOURCE_HYPERVISOR = "vsphere"
HARDWARE_PROPERTIES = (
    "name",
    "config.firmware",
    "config.bootOptions.efiSecureBootEnabled",
    "config.hardware.device",
    "config.version",
    "config.guestId",
)


class VSphereHardwareFacts:
    def __init__(self, vcenter: VCenter) -> None:
        self._vcenter = vcenter

    def hardware_of(self, vm_id: str, disk_id: str) -> Result[VirtualHardware, ProviderError]:
        """The disk is the one ExportDisk reads for `disk_id` (a device key; "" the first)."""

        def read(instance: Any) -> Result[VirtualHardware, ProviderError]:
            return self._vcenter.found_row(instance, vm_id, HARDWARE_PROPERTIES).bind(
                partial(hardware_in, disk_id=disk_id, vm_id=vm_id)
            )

        return run(self._vcenter.session, f"reading the virtual hardware of VM {vm_id!r}", read)

    def import_record_of(self, disk_path: str) -> Result[bytes | None, ProviderError]:
        """The record in the disk's folder, as the import named it; None for a disk outside
        any folder (no import of this provider puts one there)."""
        folder = datastore_files.folder_of(disk_path)
        if not folder:
            return Success(None)
        return run(
            self._vcenter.session,
            f"reading the import record of {disk_path!r}",
            partial(datastore_files.read_small, datastore_path=record_path(folder)),
        )


def hardware_in(
    row: Mapping[str, Any], disk_id: str, vm_id: str
) -> Result[VirtualHardware, ProviderError]:
    """The VirtualHardware a row with HARDWARE_PROPERTIES tells, with the controller of the
    disk `disk_id` names; NOT_FOUND when it names none."""
    devices = row.get("config.hardware.device") or ()
    disks = virtual_disks(row)

    def hardware(index: int) -> VirtualHardware:
        return VirtualHardware(
            source_hypervisor=SOURCE_HYPERVISOR,
            firmware=Firmware.UEFI if row.get("config.firmware") == "efi" else Firmware.BIOS,
            secure_boot=bool(row.get("config.bootOptions.efiSecureBootEnabled")),
            disk_controller=controller_of(disks[index], devices),
            nic_models=nic_words(devices),
            machine_type=str(row.get("config.version") or ""),
            guest_os=str(row.get("config.guestId") or ""),
        )

    return disk_index(disks, disk_id, str(row.get("name") or vm_id)).map(hardware)
