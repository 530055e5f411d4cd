"""Inventory on vSphere: Describe and ListVMs from the inventory cache once it is warm; before
that, or for a VM the cache has not seen, one property read (Describe) or one listing, save a
ListVMs while the cache's feed reads the whole view: that one waits for the feed's read."""

from __future__ import annotations

from typing import Any

from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import run
from pyrigaud.adapters.hypervisors.vsphere.inventory_cache import About, InventoryCache
from pyrigaud.adapters.hypervisors.vsphere.properties import VM_PROPERTIES, retrieve_all_vms
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import VMEntry, vm_entry, vm_info
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import VMDescription, VMInfo
from pyrigaud.domain.power import PowerState

# How long a ListVMs waits for the cache's feed to finish reading the whole view (after a
# start or a resync) rather than read every VM a second time beside it, holding both reads in
# memory at once. Half the manager's 2-minute ListVMs deadline: the other half is left for a
# read of its own should the feed be slower.
WARM_WAIT_SECONDS = 60.0


class VSphereInventory:
    def __init__(self, vcenter: VCenter, cache: InventoryCache) -> None:
        self._vcenter = vcenter
        self._cache = cache

    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        cached = self._cache.entry(vm_id)
        about = self._cache.about
        if cached is not None and about is not None:
            return Success(self._description(cached, about))

        def read(instance: Any) -> Result[VMDescription | None, ProviderError]:
            row = self._vcenter.vm_row(instance, vm_id, VM_PROPERTIES)
            if row is None:
                return Success(None)
            found = instance.content.about
            return Success(
                self._description(vm_entry(row), About(str(found.apiType), str(found.instanceUuid)))
            )

        return run(self._vcenter.session, f"describing VM {vm_id!r}", read)

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        """Read from vCenter always: Reconfigure checks the VM's state as it is right now."""

        def read(instance: Any) -> Result[VMInfo | None, ProviderError]:
            row = self._vcenter.vm_row(instance, vm_id, VM_PROPERTIES)
            return Success(None if row is None else vm_info(row))

        return run(self._vcenter.session, f"reading VM {vm_id!r}", read)

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        """Each VM by its instanceUuid, as Create names it. From the cache, waiting for it when
        its feed is reading the whole view; else read from vCenter, the MoRefs read on the way
        remembered, so that Describe of a listed VM needs no lookup."""
        cached = self._cache.entries_once_read(WARM_WAIT_SECONDS)
        if cached is not None:
            return Success([entry.info() for entry in cached])

        def read(instance: Any) -> Result[list[VMInfo], ProviderError]:
            rows = retrieve_all_vms(instance, VM_PROPERTIES)
            for row in rows:
                self._vcenter.remember_moref(row)
            return Success([vm_info(row) for row in rows])

        return run(self._vcenter.session, "listing VMs", read)

    def _description(self, entry: VMEntry, about: About) -> VMDescription:
        return VMDescription(
            power_state=PowerState.ON if entry.on else PowerState.OFF,
            ips=entry.ips,
            console_url=self._console_url(about, entry.moref),
            raw={
                "name": entry.name,
                "moref": entry.moref,
                "numCPU": str(entry.cpu),
                "memoryMB": str(entry.memory_mib),
                "disk_controller": entry.disk_controller,
                "nic_models": entry.nic_models,
            },
        )

    def _console_url(self, about: About, moref: str) -> str:
        """The VM's page in the vSphere Client (or the ESXi Host Client): no round trip."""
        origin = self._vcenter.session.web_origin
        if about.api_type == "HostAgent":
            return f"{origin}/ui/#/host/vms/{moref}"
        urn = f"urn:vmomi:VirtualMachine:{moref}:{about.instance_uuid}"
        return f"{origin}/ui/#?extensionId=vsphere.core.vm.summary&objectId={urn}"
