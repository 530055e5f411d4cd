"""What a hypervisor knows of a guest's virtual hardware, for a migrated VM that boots.

An export writes what the source VM's guest boots on beside the staged disk (its hardware
manifest); an import keeps it in its record beside the landed disk; Create from that disk
reads the record back and gives the guest the nearest equivalent (`CreateRequest.hardware`).
The manifest's and the record's formats are the application's; these ports are only what
differs per hypervisor: reading a VM's devices, and finding the record beside a disk.
"""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import VirtualHardware


class HardwareFacts(Protocol):
    def hardware_of(self, vm_id: str, disk_id: str) -> Result[VirtualHardware, ProviderError]:
        """What VM `vm_id`'s guest boots on, with the controller of its disk `disk_id` (""
        for the first disk, as ExportDisk reads it): firmware, secure boot, the disk's
        controller, the NICs' models in order, the machine type and the guest OS id the
        hypervisor knows. A device with no word in the domain's vocabulary is None."""
        ...

    def import_record_of(self, disk_path: str) -> Result[bytes | None, ProviderError]:
        """The record an import kept beside the disk at `disk_path` (the Path ImportDisk
        answered, which Create's image path names); None when the disk has none (not
        imported, or imported by another provider)."""
        ...
