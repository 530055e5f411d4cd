"""What the contract suite needs of a backend besides its adapter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pyrigaud.adapters.clocks import ManualClock
from pyrigaud.application.ports import (
    CapabilitySource,
    Cloning,
    DiskTransfer,
    Health,
    Images,
    Inventory,
    PowerControl,
    Snapshots,
    TaskTracker,
    VMLifecycle,
)
from pyrigaud.domain.models import CreateRequest, VMClass, VMImage


class Hypervisor(
    VMLifecycle,
    PowerControl,
    Snapshots,
    Cloning,
    Images,
    DiskTransfer,
    Inventory,
    Health,
    CapabilitySource,
    TaskTracker,
    Protocol,
):
    """An adapter that serves every port, as each hypervisor backend does."""


@dataclass
class Harness:
    adapter: Hypervisor
    clock: ManualClock
    image: VMImage  # an image that exists on the backend, for "create from an image"
    # False where running VMs have no guest OS (blank disks), so nothing can report an address.
    guest_reports_addresses: bool = True
    # False where the backend cannot make a blank root disk (vSphere): requests then use `image`.
    blank_images: bool = True

    def request(self, name: str, **changes: object) -> CreateRequest:
        image = VMImage() if self.blank_images else self.image
        base = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256), image=image)
        return base.model_copy(update=changes)
