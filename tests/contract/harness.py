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

    def request(self, name: str, **changes: object) -> CreateRequest:
        base = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256))
        return base.model_copy(update=changes)
