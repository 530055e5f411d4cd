"""Reconfigure and HardwareUpgrade: the rules that hold on every hypervisor."""

from __future__ import annotations

from functools import partial

from returns.result import Failure, Result, Success

from pyrigaud.application.ports import CapabilitySource, Inventory, VMLifecycle
from pyrigaud.application.use_cases.capabilities import require
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskSpec, VMChanges, VMInfo
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef


class ReconfigureVM:
    def __init__(self, lifecycle: VMLifecycle, inventory: Inventory) -> None:
        self._lifecycle = lifecycle
        self._inventory = inventory

    def __call__(self, vm_id: str, changes: VMChanges) -> Result[TaskRef | None, ProviderError]:
        """Apply what differs; disks only grow, CPU and memory shrink only while off.

        A Reconfigure that reports success (or whose task does) must have changed what was
        asked: the adapter either applies each change (online or for the next boot) or
        refuses it. None means done; a TaskRef is the hypervisor's task doing it.
        """
        match self._inventory.vm_info(vm_id):
            case Failure() as failed:
                return failed
            case Success(None):
                return Failure(ProviderError.vm_not_found(vm_id))
            case Success(VMInfo() as current):
                pass
        return _effective(changes, current).bind(partial(self._applied, vm_id))

    def _applied(self, vm_id: str, effective: VMChanges) -> Result[TaskRef | None, ProviderError]:
        """Changes that leave the VM as it is are done already."""
        if effective.is_empty:
            return Success(None)
        return self._lifecycle.reconfigure(vm_id, effective)


def _effective(changes: VMChanges, current: VMInfo) -> Result[VMChanges, ProviderError]:
    """Drop what already matches; refuse shrinking disks, and shrinking CPU/memory while on."""
    running = current.power_state is PowerState.ON
    cpu = changes.cpu if changes.cpu != current.cpu else None
    memory = changes.memory_mib if changes.memory_mib != current.memory_mib else None
    if running and cpu is not None and cpu < current.cpu:
        return Failure(
            ProviderError.failed_precondition(
                f"CPU can only shrink while the VM is off ({current.cpu} -> {cpu}); power it off"
            )
        )
    if running and memory is not None and memory < current.memory_mib:
        return Failure(
            ProviderError.failed_precondition(
                f"memory can only shrink while the VM is off ({current.memory_mib} -> {memory} "
                "MiB); power it off"
            )
        )
    sizes = [disk.size_gib for disk in current.disks]
    root = changes.root_disk_gib
    if root is not None and sizes:
        if root < sizes[0]:
            return Failure(_shrink_error("root disk", sizes[0], root))
        root = root if root > sizes[0] else None
    disks: list[DiskSpec] = []
    for index, disk in enumerate(changes.disks):
        position = index + 1  # extra disks follow the root disk
        if position < len(sizes) and 0 < disk.size_gib < sizes[position]:
            return Failure(_shrink_error(f"Disks[{index}]", sizes[position], disk.size_gib))
        unchanged = position < len(sizes) and disk.size_gib in (0, sizes[position])
        disks.append(disk.model_copy(update={"size_gib": 0}) if unchanged else disk)
    while disks and disks[-1].size_gib == 0:
        disks.pop()
    return Success(VMChanges(cpu=cpu, memory_mib=memory, root_disk_gib=root, disks=tuple(disks)))


def _shrink_error(what: str, current: int, wanted: int) -> ProviderError:
    return ProviderError.failed_precondition(
        f"{what} cannot shrink ({current} GiB -> {wanted} GiB); disks only grow"
    )


class UpgradeHardware:
    def __init__(self, lifecycle: VMLifecycle, capabilities: CapabilitySource) -> None:
        self._lifecycle = lifecycle
        self._capabilities = capabilities

    def __call__(self, vm_id: str, target_version: int) -> Result[TaskRef | None, ProviderError]:
        """None means done; a TaskRef is the hypervisor's task doing it."""
        supported = self._capabilities.capabilities().supports_hardware_upgrade
        return Result.do(
            task
            for _ in require(supported, "virtual hardware upgrades")
            for task in self._lifecycle.upgrade_hardware(vm_id, target_version)
        )
