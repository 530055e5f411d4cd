"""Reading VMs: the hot path (Describe every ~10 s per VM) and the bulk listing."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import VMDescription, VMInfo


class Inventory(Protocol):
    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        """O(1) in the number of VMs; None when no VM has that id (whatever its shape)."""
        ...

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        """One VM's configuration (CPU, memory, disks) as ListVMs would report it, or None."""
        ...

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        """Every VM, in one bulk read (never one hypervisor round trip per VM)."""
        ...
