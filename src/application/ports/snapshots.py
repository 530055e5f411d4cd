"""Point-in-time snapshots of a VM."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Snapshot, SnapshotRequest
from pyrigaud.domain.tasks import TaskRef


class Snapshots(Protocol):
    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        """With memory state where possible when asked, else disk-only, else FAILED_PRECONDITION."""
        ...

    def delete_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:
        """None when done within the call, else the hypervisor's task doing it."""
        ...

    def revert_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:
        """Restore disks, CPU and memory configuration (and memory state if captured); None
        when done within the call, else the hypervisor's task doing it."""
        ...
