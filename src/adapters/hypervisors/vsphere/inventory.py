"""Inventory on vSphere: Describe in one property read, ListVMs in one listing."""

from __future__ import annotations

from typing import Any

from returns.result import Result

from pyrigaud.adapters.hypervisors.vsphere.errors import run
from pyrigaud.adapters.hypervisors.vsphere.properties import VM_PROPERTIES, retrieve_all_vms
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import ips, power_state, vm_info
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import VMDescription, VMInfo


class VSphereInventory:
    def __init__(self, vcenter: VCenter) -> None:
        self._vcenter = vcenter

    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        def read(instance: Any) -> VMDescription | None:
            row = self._vcenter.vm_row(
                instance, vm_id, ("name", "runtime.powerState", "guest.net", "config.hardware")
            )
            if row is None:
                return None
            hardware = row.get("config.hardware")
            moref = str(row["_ref"]._moId)
            raw = {"name": str(row.get("name", "")), "moref": moref}
            if hardware is not None:
                raw |= {"numCPU": str(hardware.numCPU), "memoryMB": str(hardware.memoryMB)}
            return VMDescription(
                power_state=power_state(row),
                ips=ips(row),
                console_url=self._console_url(instance, moref),
                raw=raw,
            )

        return run(self._vcenter.session, f"describing VM {vm_id!r}", read)

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        def read(instance: Any) -> VMInfo | None:
            row = self._vcenter.vm_row(instance, vm_id, VM_PROPERTIES)
            return None if row is None else vm_info(row)

        return run(self._vcenter.session, f"reading VM {vm_id!r}", read)

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        """Each VM by its instanceUuid, as Create names it; the MoRefs read on the way are
        remembered, so that Describe of a listed VM needs no lookup."""

        def read(instance: Any) -> list[VMInfo]:
            rows = retrieve_all_vms(instance, VM_PROPERTIES)
            for row in rows:
                self._vcenter.remember_moref(row)
            return [vm_info(row) for row in rows]

        return run(self._vcenter.session, "listing VMs", read)

    def _console_url(self, instance: Any, vm_id: str) -> str:
        """The VM's page in the vSphere Client (or the ESXi Host Client), from the login's
        ServiceContent: no round trip."""
        about = instance.content.about
        origin = self._vcenter.session.web_origin
        if about.apiType == "HostAgent":
            return f"{origin}/ui/#/host/vms/{vm_id}"
        urn = f"urn:vmomi:VirtualMachine:{vm_id}:{about.instanceUuid}"
        return f"{origin}/ui/#?extensionId=vsphere.core.vm.summary&objectId={urn}"
