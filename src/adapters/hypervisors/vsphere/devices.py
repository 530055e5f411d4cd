"""Device changes for clone and reconfigure specs: disk growth, new disks, and the NIC count
a guest customization is sized to."""

from __future__ import annotations

from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskSpec, VMChanges

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

GIB = 1024**3
# Disk type -> (thinProvisioned, eagerlyScrub).
DISK_PROVISIONING = {
    "thin": (True, False),
    "thick": (False, False),
    "eagerzeroedthick": (False, True),
}


def disk_growth(devices: list[Any], changes: VMChanges) -> Result[list[Any], ProviderError]:
    """Edit specs growing the root disk and the extra disks (by position); disks never shrink."""
    disks = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
    wanted: list[int | None] = [changes.root_disk_gib, *(spec.size_gib for spec in changes.disks)]
    edits = []
    for disk, size_gib in zip(disks, wanted, strict=False):
        if size_gib is None:
            continue
        if size_gib * 1024 * 1024 < disk.capacityInKB:
            return Failure(ProviderError.failed_precondition(f"disk {disk.key} cannot shrink"))
        disk.capacityInKB = size_gib * 1024 * 1024
        disk.capacityInBytes = size_gib * GIB
        edits.append(vim.vm.device.VirtualDeviceSpec(operation="edit", device=disk))
    if len(changes.disks) > max(len(disks) - 1, 0):
        return Failure(
            ProviderError.invalid_spec(fields.DESIRED_DISKS, "only existing disks can grow")
        )
    return Success(edits)


def new_disks(devices: list[Any], disks: tuple[DiskSpec, ...]) -> Result[list[Any], ProviderError]:
    """Add specs for extra disks (thin unless asked otherwise) on the first SCSI controller."""
    if not disks:
        return Success([])
    provisioning: list[tuple[bool, bool]] = []
    for index, spec in enumerate(disks):
        match _provisioning(spec, index):
            case Success(chosen):
                provisioning.append(chosen)
            case Failure() as failed:
                return failed
    controllers = [d for d in devices if isinstance(d, vim.vm.device.VirtualSCSIController)]
    if not controllers:
        return Failure(
            ProviderError.failed_precondition("the VM has no SCSI controller for extra disks")
        )
    controller = controllers[0]
    used = {d.unitNumber for d in devices if d.controllerKey == controller.key}
    free = [unit for unit in range(16) if unit != 7 and unit not in used]
    if len(free) < len(disks):
        return Failure(ProviderError.resource_exhausted("no free SCSI unit for another disk"))
    return Success(_added_disks(controller, disks, free, provisioning))


def _added_disks(
    controller: Any,
    disks: tuple[DiskSpec, ...],
    free: list[int],
    provisioning: list[tuple[bool, bool]],
) -> list[Any]:
    return [
        vim.vm.device.VirtualDeviceSpec(
            operation="add",
            fileOperation="create",
            device=vim.vm.device.VirtualDisk(
                key=-100 - index,
                controllerKey=controller.key,
                unitNumber=unit,
                capacityInKB=spec.size_gib * 1024 * 1024,
                backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
                    diskMode="persistent",
                    thinProvisioned=thin,
                    eagerlyScrub=eager,
                    fileName="",
                ),
            ),
        )
        for index, (spec, unit, (thin, eager)) in enumerate(
            zip(disks, free, provisioning, strict=False)
        )
    ]


def _provisioning(spec: DiskSpec, index: int) -> Result[tuple[bool, bool], ProviderError]:
    """(thinProvisioned, eagerlyScrub) for the disk type the request names."""
    kind = spec.type.strip().lower() or "thin"
    if kind not in DISK_PROVISIONING:
        known = ", ".join(DISK_PROVISIONING)
        return Failure(
            ProviderError.invalid_spec(
                fields.disk_type(index), f"one of {known}, got {spec.type!r}"
            )
        )
    return Success(DISK_PROVISIONING[kind])


def nic_count(devices: list[Any], changes: list[Any] | None) -> int:
    """How many NICs the VM has once `changes` are applied to `devices`."""
    count = sum(isinstance(device, vim.vm.device.VirtualEthernetCard) for device in devices)
    for change in changes or ():
        if isinstance(change.device, vim.vm.device.VirtualEthernetCard):
            count += {"add": 1, "remove": -1}.get(str(change.operation), 0)
    return count
