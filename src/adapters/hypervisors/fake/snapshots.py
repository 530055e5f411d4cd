"""Snapshots on the fake hypervisor: a revert restores CPU, memory, disk sizes and power."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor, FakeSnapshot, FakeVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Snapshot, SnapshotRequest


@dataclass(frozen=True)
class FakeSnapshots:
    hypervisor: FakeHypervisor

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        def created() -> Result[Snapshot, ProviderError]:
            return self.hypervisor.vm(request.vm_id).map(partial(self._create, request=request))

        return self.hypervisor.serve("create_snapshot", created)

    def delete_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def delete(_: FakeSnapshot) -> None:
            del self.hypervisor.vms[vm_id].snapshots[snapshot_id]

        def deleted() -> Result[None, ProviderError]:
            return self._snapshot(vm_id, snapshot_id).map(delete)

        return self.hypervisor.serve("delete_snapshot", deleted)

    def revert_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def reverted() -> Result[None, ProviderError]:
            return self._snapshot(vm_id, snapshot_id).map(partial(self._revert, vm_id))

        return self.hypervisor.serve("revert_snapshot", reverted)

    def _create(self, vm: FakeVM, request: SnapshotRequest) -> Snapshot:
        existing = vm.snapshots.get(request.name)
        if existing is not None:
            return existing.snapshot  # a retried request: the same snapshot
        snapshot = Snapshot(
            id=request.name,
            name=request.name,
            description=request.description,
            include_memory=request.include_memory and self.hypervisor.running(vm),
        )
        vm.snapshots[snapshot.id] = FakeSnapshot(
            snapshot=snapshot,
            cpu=vm.cpu,
            memory_mib=vm.memory_mib,
            disk_sizes=[disk.size_gib for disk in vm.disks],
            running=snapshot.include_memory,
        )
        return snapshot

    def _revert(self, vm_id: str, found: FakeSnapshot) -> None:
        vm = self.hypervisor.vms[vm_id]
        vm.cpu, vm.memory_mib = found.cpu, found.memory_mib
        for disk, size in zip(vm.disks, found.disk_sizes, strict=False):
            disk.size_gib = size
        del vm.disks[len(found.disk_sizes) :]
        if found.running:
            self.hypervisor.start(vm)
        else:
            self.hypervisor.stop(vm)

    def _snapshot(self, vm_id: str, snapshot_id: str) -> Result[FakeSnapshot, ProviderError]:
        return self.hypervisor.vm(vm_id).bind(partial(_snapshot_of, snapshot_id=snapshot_id))


def _snapshot_of(vm: FakeVM, snapshot_id: str) -> Result[FakeSnapshot, ProviderError]:
    found = vm.snapshots.get(snapshot_id)
    if found is None:
        return Failure(ProviderError.not_found(f"VM {vm.name!r} has no snapshot {snapshot_id!r}"))
    return Success(found)
