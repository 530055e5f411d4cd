"""Describe (the hottest call) and ListVMs."""

from __future__ import annotations

from returns.result import Result, Success

from pyrigaud.application.ports import Inventory
from pyrigaud.domain.addresses import routable_addresses
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import VMDescription, VMInfo


class DescribeVM:
    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory

    def __call__(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        """None (exists=false) for any id that names no VM; an error means "could not tell"."""
        described = self._inventory.describe(vm_id)
        match described:
            case Success(found):
                reportable = _reportable_description(found)
                # The port's own Success when nothing changed: no second container per call.
                return described if reportable is found else Success(reportable)
        return described


def _reportable_description(found: VMDescription | None) -> VMDescription | None:
    if found is None:
        return None
    ips = routable_addresses(found.ips)
    if ips == found.ips:
        return found
    # The constructor, not dataclasses.replace: half the cost, on every running VM's Describe.
    return VMDescription(found.power_state, ips, found.console_url, found.raw)


def _reportable_info(vm: VMInfo) -> VMInfo:
    ips = routable_addresses(vm.ips)
    return vm if ips == vm.ips else vm.model_copy(update={"ips": ips})


class ListVMs:
    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory

    def __call__(self) -> Result[list[VMInfo], ProviderError]:
        return Result.do([_reportable_info(vm) for vm in vms] for vms in self._inventory.list_vms())
