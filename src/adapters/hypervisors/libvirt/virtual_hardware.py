"""HardwareFacts on libvirt: what a domain's guest boots on, read off its definition, and the
import record kept beside a landed disk volume (disk_landing.py's).

The firmware is UEFI for `<os firmware='efi'>` or a pflash loader, with secure boot from the
firmware's `secure-boot` feature or a secure loader; the disk is the one ExportDisk reads for
`disk_id`; the guest OS is the libosinfo id virt-install and virt-manager write.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import partial

from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.device_models import (
    SOURCE_HYPERVISOR,
    disk_controller_of,
    nic_model_of,
)
from pyrigaud.adapters.hypervisors.libvirt.disk_landing import import_record_beside
from pyrigaud.adapters.hypervisors.libvirt.disk_transfer import chosen_disk
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DiskDevice, NicDevice, parse_domain
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest, guest_action
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.storage import volume_facts
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import Firmware, VirtualHardware

LIBOSINFO_NAMESPACE = "http://libosinfo.org/xmlns/libvirt/domain/1.0"
_LIBOSINFO_OS = f"metadata/{{{LIBOSINFO_NAMESPACE}}}libosinfo/{{{LIBOSINFO_NAMESPACE}}}os"


@dataclass(frozen=True)
class LibvirtHardwareFacts:
    host: LibvirtHost

    def hardware_of(self, vm_id: str, disk_id: str) -> Result[VirtualHardware, ProviderError]:
        def read(_conn: VirConnect, guest: Guest) -> Result[VirtualHardware, ProviderError]:
            return hardware_in(guest.inactive_xml(), disk_id)

        return self.host.run(f"read the hardware of VM {vm_id!r}", guest_action(vm_id, read))

    def import_record_of(self, disk_path: str) -> Result[bytes | None, ProviderError]:
        def read(conn: VirConnect) -> Result[bytes | None, ProviderError]:
            if volume_facts(conn, disk_path) is None:
                return Success(None)  # no volume there: nothing was landed at that path
            volume = conn.storageVolLookupByPath(disk_path)
            pool = volume.storagePoolLookupByVolume()
            return import_record_beside(conn, pool, str(volume.name()))

        return self.host.run(f"read the import record of {disk_path!r}", read)


def hardware_in(xml: str, disk_id: str) -> Result[VirtualHardware, ProviderError]:
    """The hardware a domain of definition `xml` gives its guest, with the controller of disk
    `disk_id` ("" for the first, as ExportDisk reads it)."""
    facts = parse_domain(xml)
    root = ET.fromstring(xml)  # noqa: S314 - libvirt's own output
    return chosen_disk(facts.name, facts.disks, disk_id).map(
        partial(_hardware, root, nics=facts.nics)
    )


def _hardware(root: ET.Element, disk: DiskDevice, nics: tuple[NicDevice, ...]) -> VirtualHardware:
    os_element = root.find("os")
    uefi = secure = False
    machine = ""
    if os_element is not None:
        loader = os_element.find("loader")
        uefi = os_element.get("firmware") == "efi" or (
            loader is not None and loader.get("type") == "pflash"
        )
        secure = (loader is not None and loader.get("secure") == "yes") or any(
            feature.get("name") == "secure-boot" and feature.get("enabled") == "yes"
            for feature in os_element.iterfind("firmware/feature")
        )
        os_type = os_element.find("type")
        machine = os_type.get("machine", "") if os_type is not None else ""
    guest_os = root.find(_LIBOSINFO_OS)
    return VirtualHardware(
        source_hypervisor=SOURCE_HYPERVISOR,
        firmware=Firmware.UEFI if uefi else Firmware.BIOS,
        secure_boot=uefi and secure,
        disk_controller=disk_controller_of(disk),
        nic_models=tuple(nic_model_of(nic.model) for nic in nics),
        machine_type=machine,
        guest_os=guest_os.get("id", "") if guest_os is not None else "",
    )
