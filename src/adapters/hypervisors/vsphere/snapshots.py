"""Snapshots on vSphere: SnapshotCreate waits for its Task (the response carries the
snapshot), removal and revert hand back their Task's id. A snapshot is named by its MoRef
(snapshot-42) or by its name."""

from __future__ import annotations

from operator import attrgetter, methodcaller
from typing import Any

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import run
from pyrigaud.adapters.hypervisors.vsphere.tasks import TaskOperation, begin, wait
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Snapshot, SnapshotRequest
from pyrigaud.domain.tasks import TaskRef


class VSphereSnapshots:
    def __init__(self, vcenter: VCenter) -> None:
        self._vcenter = vcenter

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        def take(instance: Any) -> Result[Snapshot, ProviderError]:
            def taken(vm: Any) -> Result[Any, ProviderError]:
                task = vm.CreateSnapshot_Task(
                    name=request.name,
                    description=request.description,
                    memory=request.include_memory,
                    quiesce=False,
                )
                return wait(instance, task)

            def described(snapshot: Any) -> Snapshot:
                return Snapshot(
                    id=str(snapshot._moId),
                    name=request.name,
                    description=request.description,
                    include_memory=request.include_memory,
                )

            return self._vcenter.vm(instance, request.vm_id).bind(taken).map(described)

        return run(self._vcenter.session, f"snapshotting VM {request.vm_id!r}", take)

    def delete_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:

        def start(instance: Any) -> Result[Any, ProviderError]:
            return find_snapshot(self._vcenter, instance, vm_id, snapshot_id).map(
                methodcaller("RemoveSnapshot_Task", False)
            )

        operation = TaskOperation(f"deleting snapshot {snapshot_id!r}", vm_id, start)
        return begin(self._vcenter.session, operation)

    def revert_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:

        def start(instance: Any) -> Result[Any, ProviderError]:
            return find_snapshot(self._vcenter, instance, vm_id, snapshot_id).map(
                methodcaller("RevertToSnapshot_Task")
            )

        operation = TaskOperation(f"reverting to snapshot {snapshot_id!r}", vm_id, start)
        return begin(self._vcenter.session, operation)


def snapshot_trees(vcenter: VCenter, instance: Any, vm_id: str) -> Result[list[Any], ProviderError]:
    """Every snapshot of the VM (one round trip), flattened from the snapshot tree."""
    return vcenter.found_row(instance, vm_id, ("snapshot",)).map(_flattened)


def _flattened(row: dict[str, Any]) -> list[Any]:
    info = row.get("snapshot")
    pending = list(info.rootSnapshotList) if info is not None else []
    trees = []
    for _ in range(100_000):
        if not pending:
            break
        tree = pending.pop()
        trees.append(tree)
        pending.extend(tree.childSnapshotList or ())
    return trees


def find_snapshot(
    vcenter: VCenter, instance: Any, vm_id: str, snapshot_id: str
) -> Result[Any, ProviderError]:
    """The VM's snapshot named by MoRef value or name; NOT_FOUND otherwise."""
    return find_snapshot_tree(vcenter, instance, vm_id, snapshot_id).map(attrgetter("snapshot"))


def find_snapshot_tree(
    vcenter: VCenter, instance: Any, vm_id: str, snapshot_id: str
) -> Result[Any, ProviderError]:
    """The snapshot's node in the VM's snapshot tree (its `childSnapshotList` are the
    snapshots taken after it); NOT_FOUND otherwise."""

    def node(trees: list[Any]) -> Result[Any, ProviderError]:
        for tree in trees:
            if snapshot_id in (tree.snapshot._moId, tree.name):
                return Success(tree)
        return Failure(
            ProviderError.not_found(f"snapshot {snapshot_id!r} of VM {vm_id!r} not found")
        )

    return snapshot_trees(vcenter, instance, vm_id).bind(node)
