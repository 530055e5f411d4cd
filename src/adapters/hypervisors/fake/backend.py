"""The fake backend: each port served by its own module over one in-memory hypervisor."""

from __future__ import annotations

from pyrigaud.adapters.hypervisors.fake.capabilities import FakeCapabilities
from pyrigaud.adapters.hypervisors.fake.cloning import FakeCloning
from pyrigaud.adapters.hypervisors.fake.disk_transfer import FakeDiskTransfer
from pyrigaud.adapters.hypervisors.fake.health import FakeHealth
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.adapters.hypervisors.fake.images import FakeImages
from pyrigaud.adapters.hypervisors.fake.inventory import FakeInventory
from pyrigaud.adapters.hypervisors.fake.power import FakePowerControl
from pyrigaud.adapters.hypervisors.fake.provisioning import FakeVMLifecycle
from pyrigaud.adapters.hypervisors.fake.snapshots import FakeSnapshots
from pyrigaud.adapters.hypervisors.fake.tasks import FakeTaskTracker
from pyrigaud.adapters.hypervisors.fake.virtual_hardware import FakeHardwareFacts
from pyrigaud.application.backend import Backend


def fake_backend(hypervisor: FakeHypervisor) -> Backend:
    """Every port over `hypervisor`, whose test hooks stay with the caller."""
    disk_transfer = FakeDiskTransfer(hypervisor)
    return Backend(
        lifecycle=FakeVMLifecycle(hypervisor),
        power=FakePowerControl(hypervisor),
        inventory=FakeInventory(hypervisor),
        health=FakeHealth(hypervisor),
        capabilities=FakeCapabilities(hypervisor),
        tasks=FakeTaskTracker(),
        snapshots=FakeSnapshots(hypervisor),
        cloning=FakeCloning(hypervisor),
        images=FakeImages(hypervisor),
        disk_transfer=disk_transfer,
        transfer_leftovers=disk_transfer,
        hardware=FakeHardwareFacts(hypervisor),
    )
