"""The vCenter (or ESXi host) every port of the backend talks to: one session, and the VM
lookups the ports share.

A VM is named by its instanceUuid: Create and Clone choose it in the clone spec and return it
at once (the MoRef exists only once the clone task has finished), and ListVMs reports it. A
MoRef (vm-42: an id stored earlier, or taken from vCenter's tools) names it too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from operator import itemgetter
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import or_none
from pyrigaud.adapters.hypervisors.vsphere.properties import (
    extra_config,
    retrieve,
    retrieve_all_vms,
)
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.adapters.hypervisors.vsphere.tasks import ended
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import RECORD_PROPERTIES, power_state, vm_record
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import VMRecord
from pyrigaud.domain.power import PowerState

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

# MoRef values are short ASCII words (vm-42, or 42 on a bare ESXi host); anything else names
# nothing and is answered as missing without a round trip.
MOREF_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,79}")
# What Create and Clone return: the instanceUuid pyrigaud chose for the VM in its clone spec.
INSTANCE_UUID = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


class VCenter:
    """The session and the VM lookups; every method taking `instance` runs inside a session
    call (`calls.run`): what it cannot answer (NOT_FOUND) is a Failure, vCenter's faults fly
    on to that edge."""

    def __init__(self, session: VSphereSession) -> None:
        self.session = session
        # instanceUuid -> MoRef: fixed for a VM's life, so a memo and not replica state.
        self._morefs: dict[str, str] = {}

    def vm(self, instance: Any, vm_id: str) -> Result[Any, ProviderError]:
        """The VM's MoRef, checked to exist (one round trip); NOT_FOUND otherwise."""
        return self.found_row(instance, vm_id, ("name",)).map(itemgetter("_ref"))

    def found_row(
        self, instance: Any, vm_id: str, properties: tuple[str, ...]
    ) -> Result[dict[str, Any], ProviderError]:
        """The VM's properties (one round trip); NOT_FOUND when no VM has that id."""
        row = self.vm_row(instance, vm_id, properties)
        if row is None:
            return Failure(ProviderError.vm_not_found(vm_id))
        return Success(row)

    def vm_row(
        self, instance: Any, vm_id: str, properties: tuple[str, ...]
    ) -> dict[str, Any] | None:
        """The VM's properties (one round trip), or None when no VM has that id."""
        moref = self._moref(instance, vm_id)
        if moref is None:
            return None
        vm = vim.VirtualMachine(moref, instance._stub)
        rows = or_none(partial(retrieve, instance, [vm], properties))
        return rows[0] if rows else None

    def remember_moref(self, row: Mapping[str, Any]) -> None:
        """Keep a listed VM's MoRef, so that a later lookup by instanceUuid needs no search."""
        instance_uuid = str(row.get("config.instanceUuid") or "").lower()
        if instance_uuid:
            self._morefs.setdefault(instance_uuid, str(row["_ref"]._moId))

    def _moref(self, instance: Any, vm_id: str) -> str | None:
        """The MoRef value a VM id names (None: no VM); an instanceUuid is looked up once."""
        if not INSTANCE_UUID.fullmatch(vm_id):
            return vm_id if MOREF_VALUE.fullmatch(vm_id) else None
        key = vm_id.lower()
        known = self._morefs.get(key)
        if known is None:
            found = instance.content.searchIndex.FindByUuid(
                uuid=key, vmSearch=True, instanceUuid=True
            )
            if found is None:
                return None
            known = self._morefs.setdefault(key, str(found._moId))
        return known

    def devices(self, instance: Any, vm: Any) -> list[Any]:
        row = self.vm_row(instance, vm._moId, ("config.hardware.device",))
        return list((row or {}).get("config.hardware.device") or ())

    def vm_named(self, instance: Any, name: str) -> Any:
        """The MoRef of the VM (or template) called `name`, or None."""
        rows = [row for row in retrieve_all_vms(instance, ("name",)) if row.get("name") == name]
        return rows[0]["_ref"] if rows else None

    def record(self, instance: Any, name: str) -> VMRecord | None:
        """The VM called `name` with its marks, or None."""
        vm = self.vm_named(instance, name)
        if vm is None:
            return None
        row = self.vm_row(instance, vm._moId, RECORD_PROPERTIES)
        return None if row is None else vm_record(row)

    def extra_config(self, instance: Any, vm_id: str) -> Result[dict[str, str], ProviderError]:
        return self.found_row(instance, vm_id, ("config.extraConfig",)).map(extra_config)

    def set_extra_config(
        self, instance: Any, vm: Any, values: Mapping[str, str]
    ) -> Result[None, ProviderError]:
        """Set (or, with "", clear) extraConfig keys, waiting for the reconfigure task."""
        options = [vim.option.OptionValue(key=key, value=value) for key, value in values.items()]
        task = vm.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=options))
        return ended(instance, task)

    def power(self, instance: Any, vm: Any) -> Result[PowerState, ProviderError]:
        return self.found_row(instance, vm._moId, ("runtime.powerState",)).map(power_state)
