"""SnapshotCreate / SnapshotDelete / SnapshotRevert, gated by capabilities."""

from __future__ import annotations

from returns.result import Result

from pyrigaud.application.ports import CapabilitySource, Snapshots
from pyrigaud.application.use_cases.capabilities import require
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Snapshot, SnapshotRequest
from pyrigaud.domain.tasks import TaskRef


class CreateSnapshot:
    def __init__(self, snapshots: Snapshots, capabilities: CapabilitySource) -> None:
        self._snapshots = snapshots
        self._capabilities = capabilities

    def __call__(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        """Memory state where the backend can capture it; a disk-only snapshot otherwise."""
        capabilities = self._capabilities.capabilities()
        if request.include_memory and not capabilities.supports_memory_snapshots:
            request = request.model_copy(update={"include_memory": False})
        return Result.do(
            snapshot
            for _ in require(capabilities.supports_snapshots, "snapshots")
            for snapshot in self._snapshots.create_snapshot(request)
        )


class DeleteSnapshot:
    def __init__(self, snapshots: Snapshots, capabilities: CapabilitySource) -> None:
        self._snapshots = snapshots
        self._capabilities = capabilities

    def __call__(self, vm_id: str, snapshot_id: str) -> Result[TaskRef | None, ProviderError]:
        """None means done; a TaskRef is the hypervisor's task doing it."""
        return Result.do(
            task
            for _ in require(self._capabilities.capabilities().supports_snapshots, "snapshots")
            for task in self._snapshots.delete_snapshot(vm_id, snapshot_id)
        )


class RevertSnapshot:
    def __init__(self, snapshots: Snapshots, capabilities: CapabilitySource) -> None:
        self._snapshots = snapshots
        self._capabilities = capabilities

    def __call__(self, vm_id: str, snapshot_id: str) -> Result[TaskRef | None, ProviderError]:
        """None means done; a TaskRef is the hypervisor's task doing it."""
        return Result.do(
            task
            for _ in require(self._capabilities.capabilities().supports_snapshots, "snapshots")
            for task in self._snapshots.revert_snapshot(vm_id, snapshot_id)
        )
