"""Snapshots, on every backend that has the port."""

from __future__ import annotations

from pyrigaud.application.ports import Snapshots
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import Firmware, OwnerMark, SnapshotRequest, VMChanges, VMClass

from contract.harness import Harness
from contract.steps import create, finished
from support import error_kind, ok


def snapshots_of(harness: Harness) -> Snapshots:
    assert harness.backend.snapshots is not None
    return harness.backend.snapshots


def test_snapshot_revert_restores_cpu_and_memory(
    snapshots_harness: Harness, owner: OwnerMark
) -> None:
    harness = snapshots_harness
    snapshots = snapshots_of(harness)
    vm_id = create(harness, owner, "contract-snap")
    snapshot = ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="before")))
    changes = VMChanges(cpu=4, memory_mib=2048)
    finished(harness, harness.backend.lifecycle.reconfigure(vm_id, changes))
    finished(harness, snapshots.revert_snapshot(vm_id, snapshot.id))
    info = ok(harness.backend.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (1, 256)
    finished(harness, snapshots.delete_snapshot(vm_id, snapshot.id))
    assert error_kind(snapshots.revert_snapshot(vm_id, snapshot.id)) is ErrorKind.NOT_FOUND


def test_unknown_snapshots_are_not_found(snapshots_harness: Harness, owner: OwnerMark) -> None:
    snapshots = snapshots_of(snapshots_harness)
    vm_id = create(snapshots_harness, owner, "contract-nosnap")
    assert error_kind(snapshots.delete_snapshot(vm_id, "nope")) is ErrorKind.NOT_FOUND
    assert error_kind(snapshots.revert_snapshot("missing", "nope")) is ErrorKind.NOT_FOUND


def test_a_running_uefi_vm_is_snapshotted_reverted_and_its_snapshot_deleted(
    snapshots_harness: Harness, owner: OwnerMark
) -> None:
    """UEFI firmware keeps its variables in flash beside the disks (libvirt refuses internal
    snapshots of such a VM while it runs); its snapshots work all the same, running or not."""
    harness = snapshots_harness
    snapshots = snapshots_of(harness)
    uefi = VMClass(cpu=1, memory_mib=256, firmware=Firmware.UEFI)
    vm_id = create(harness, owner, "contract-uefi-snap", vm_class=uefi)
    finished(harness, harness.backend.power.power_on(vm_id))
    running = ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="running")))
    finished(harness, snapshots.revert_snapshot(vm_id, running.id))
    finished(harness, snapshots.delete_snapshot(vm_id, running.id))
    assert error_kind(snapshots.revert_snapshot(vm_id, running.id)) is ErrorKind.NOT_FOUND
    finished(harness, harness.backend.power.power_off(vm_id))
    stopped = ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="stopped")))
    finished(harness, harness.backend.lifecycle.reconfigure(vm_id, VMChanges(memory_mib=512)))
    finished(harness, snapshots.revert_snapshot(vm_id, stopped.id))
    info = ok(harness.backend.inventory.vm_info(vm_id))
    assert info is not None
    assert info.memory_mib == 256
    finished(harness, snapshots.delete_snapshot(vm_id, stopped.id))
    finished(harness, harness.backend.lifecycle.delete(vm_id))
