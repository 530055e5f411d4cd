"""Point-in-time snapshots of a VM."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Snapshot, SnapshotRequest


class Snapshots(Protocol):
    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        """With memory state where possible when asked, else disk-only, else FAILED_PRECONDITION."""
        ...

    def delete_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]: ...

    def revert_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        """Restore disks, CPU and memory configuration (and memory state if captured)."""
        ...
