"""What one hypervisor backend serves: a port each, and None for a port it does not have."""

from __future__ import annotations

from dataclasses import dataclass

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
from pyrigaud.application.ports.disk_transfer import TransferLeftovers
from pyrigaud.application.ports.virtual_hardware import HardwareFacts


@dataclass(frozen=True)
class Backend:
    """The ports a backend implements, each from its own adapter module.

    The composition root wires use cases port by port from this; an optional port left None
    is one the backend does not have, and its RPCs answer UNSUPPORTED (its capabilities say so).
    """

    lifecycle: VMLifecycle
    power: PowerControl
    inventory: Inventory
    health: Health
    capabilities: CapabilitySource
    tasks: TaskTracker
    snapshots: Snapshots | None = None
    cloning: Cloning | None = None
    images: Images | None = None
    disk_transfer: DiskTransfer | None = None
    transfer_leftovers: TransferLeftovers | None = None
    hardware: HardwareFacts | None = None  # a migrated guest's hardware, read and found again
