"""Read your writes on vSphere: the ports whose mutations change what Describe and ListVMs
show have the inventory cache re-read the VM they changed before they return, whatever the
outcome (a failed change may have changed something too).

One wrapper per port, implementing its protocol: a mutation of a VM named by its first
argument refreshes that VM, one that makes a VM (Create, Clone) refreshes the VM it made, and
every other method is handed on as it is.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TypeVar

from returns.result import Result

from pyrigaud.adapters.hypervisors.vsphere.inventory_cache import InventoryCache
from pyrigaud.application.ports import Cloning, PowerControl, Snapshots, VMLifecycle
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    OwnerMark,
    Snapshot,
    SnapshotRequest,
    VMChanges,
    VMRecord,
)
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef

_Outcome = TypeVar("_Outcome")


class _Refresher:
    def __init__(self, cache: InventoryCache) -> None:
        self._cache = cache

    def changed(self, vm_id: str, outcome: _Outcome) -> _Outcome:
        """`outcome` of a change of the VM `vm_id`, once the cache has re-read it."""
        if vm_id:
            self._cache.refresh(vm_id)
        return outcome

    def made(self, outcome: Result[CreatedVM, ProviderError]) -> Result[CreatedVM, ProviderError]:
        """`outcome` of the making of a VM, once the cache has read the VM made (if any)."""
        return self.changed(outcome.map(attrgetter("id")).value_or(""), outcome)


class RefreshingLifecycle:
    def __init__(self, port: VMLifecycle, cache: InventoryCache) -> None:
        self._port, self._refresher = port, _Refresher(cache)

    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        return self._port.find_by_name(name)

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        return self._port.find_unfinished()

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        return self._refresher.made(self._port.start_create(request, owner))

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        return self._refresher.changed(vm_id, self._port.delete(vm_id))

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[TaskRef | None, ProviderError]:
        return self._refresher.changed(vm_id, self._port.reconfigure(vm_id, changes))

    def upgrade_hardware(
        self, vm_id: str, target_version: int
    ) -> Result[TaskRef | None, ProviderError]:
        return self._refresher.changed(vm_id, self._port.upgrade_hardware(vm_id, target_version))


class RefreshingPower:
    def __init__(self, port: PowerControl, cache: InventoryCache) -> None:
        self._port, self._refresher = port, _Refresher(cache)

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]:
        return self._port.power_state(vm_id)

    def power_on(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._refresher.changed(vm_id, self._port.power_on(vm_id))

    def power_off(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._refresher.changed(vm_id, self._port.power_off(vm_id))

    def reboot(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._refresher.changed(vm_id, self._port.reboot(vm_id))

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        return self._refresher.changed(vm_id, self._port.request_shutdown(vm_id, deadline))

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        return self._port.shutdown_deadline(vm_id)

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:
        return self._port.clear_shutdown_deadline(vm_id)


class RefreshingSnapshots:
    """A snapshot's creation or deletion changes nothing Describe or ListVMs show; a revert
    does (power state, hardware)."""

    def __init__(self, port: Snapshots, cache: InventoryCache) -> None:
        self._port, self._refresher = port, _Refresher(cache)

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        return self._port.create_snapshot(request)

    def delete_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:
        return self._port.delete_snapshot(vm_id, snapshot_id)

    def revert_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:
        return self._refresher.changed(vm_id, self._port.revert_snapshot(vm_id, snapshot_id))


class RefreshingCloning:
    def __init__(self, port: Cloning, cache: InventoryCache) -> None:
        self._port, self._refresher = port, _Refresher(cache)

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        return self._refresher.made(self._port.start_clone(request, owner))
