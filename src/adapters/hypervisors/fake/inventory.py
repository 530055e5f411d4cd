"""Inventory on the fake hypervisor: what a guest agent and the host would report."""

from __future__ import annotations

from dataclasses import dataclass

from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor, FakeVM
from pyrigaud.domain.addresses import routable_addresses
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskInfo, NetworkInfo, VMDescription, VMInfo
from pyrigaud.domain.power import PowerState

UNKNOWN = "unknown"  # Describe's word for a device with none in the domain's vocabulary


@dataclass(frozen=True)
class FakeInventory:
    hypervisor: FakeHypervisor

    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        def describe() -> Result[VMDescription | None, ProviderError]:
            vm = self.hypervisor.vms.get(vm_id)
            if vm is None:
                return Success(None)
            running = self.hypervisor.running(vm)
            description = VMDescription(
                power_state=PowerState.ON if running else PowerState.OFF,
                ips=_guest_addresses(vm, running),
                console_url=f"vnc://127.0.0.1:{5900 + int(vm.id[-4:], 16) % 1000}"
                if running
                else "",
                raw=_raw(vm),
            )
            return Success(description)

        return self.hypervisor.serve("describe", describe)

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        def info() -> Result[VMInfo | None, ProviderError]:
            vm = self.hypervisor.vms.get(vm_id)
            return Success(None if vm is None else self._info(vm))

        return self.hypervisor.serve("vm_info", info)

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        def listed() -> Result[list[VMInfo], ProviderError]:
            return Success([self._info(vm) for vm in self.hypervisor.vms.values()])

        return self.hypervisor.serve("list_vms", listed)

    def _info(self, vm: FakeVM) -> VMInfo:
        running = self.hypervisor.running(vm)
        addresses = _guest_addresses(vm, running)
        routable = routable_addresses(addresses)
        return VMInfo(
            id=vm.id,
            name=vm.name,
            power_state=PowerState.ON if running else PowerState.OFF,
            ips=addresses,
            cpu=vm.cpu,
            memory_mib=vm.memory_mib,
            disks=tuple(
                DiskInfo(id=disk.id, path=disk.path, size_gib=disk.size_gib, format=disk.format)
                for disk in vm.disks
            ),
            networks=tuple(
                NetworkInfo(
                    name=nic.name,
                    mac=nic.mac,
                    ip_address=routable[index] if index < len(routable) else "",
                )
                for index, nic in enumerate(vm.nics)
            ),
            provider_raw=_raw(vm),
        )


def _guest_addresses(vm: FakeVM, running: bool) -> tuple[str, ...]:
    """What a guest agent reports: loopback and link-local included, as real ones do."""
    if not running:
        return ()
    serial = int(vm.id[:6], 16)
    addresses = ["127.0.0.1", "::1", "fe80::5054:ff:fe00:1"]
    for index in range(len(vm.nics) or 1):  # no NIC named: user-mode networking's one
        addresses.append(f"198.51.100.{(serial + index) % 250 + 2}")
    return tuple(addresses)


def _raw(vm: FakeVM) -> dict[str, str]:
    return {
        "id": vm.id,
        "name": vm.name,
        "state": "paused" if vm.paused else "running" if vm.running else "shut off",
        "cpu": str(vm.cpu),
        "memory_mib": str(vm.memory_mib),
        "firmware": vm.firmware,
        "hardware_version": str(vm.hardware_version),
        "pending_restart": "true" if vm.pending_restart else "false",
        "hostname": vm.hostname,
        "disk_controller": str(vm.disk_controller or UNKNOWN),
        "nic_models": ",".join(str(nic.model or UNKNOWN) for nic in vm.nics),
    }
