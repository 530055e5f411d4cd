"""What a VM's property-collector row says, as domain values, and the marks pyrigaud keeps in
a VM's extraConfig."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.properties import extra_config
from pyrigaud.domain.addresses import routable_addresses
from pyrigaud.domain.models import DiskInfo, NetworkInfo, OwnerMark, VMInfo, VMRecord
from pyrigaud.domain.power import PowerState

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

OWNER_KEY = "pyrigaud.owner"
# Unix time a Create (or Clone) made in several steps began; removed once the VM is complete.
BUILDING_KEY = "pyrigaud.building"
SHUTDOWN_DEADLINE_KEY = "pyrigaud.shutdownDeadline"
RECORD_PROPERTIES = ("name", "config.extraConfig", "config.instanceUuid")


def vm_id(row: Mapping[str, Any]) -> str:
    """The VM's id as Create returns it: its instanceUuid (the MoRef for a VM without one)."""
    return str(row.get("config.instanceUuid") or row["_ref"]._moId)


def vm_record(row: Mapping[str, Any]) -> VMRecord:
    """Id, name, ownership and building marks from a row with RECORD_PROPERTIES.

    A building mark set to "" was cleared (vCenter removes the key, the simulator keeps it)."""
    extra = extra_config(row)
    owner = extra.get(OWNER_KEY, "")
    return VMRecord(
        id=vm_id(row),
        name=str(row.get("name", "")),
        owner=OwnerMark(provider=owner) if owner else None,
        building_since=_unix_time(extra.get(BUILDING_KEY, "")),
    )


def _unix_time(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) else None


def power_state(row: Mapping[str, Any]) -> PowerState:
    on = row.get("runtime.powerState") == vim.VirtualMachinePowerState.poweredOn
    return PowerState.ON if on else PowerState.OFF


def ips(row: Mapping[str, Any]) -> tuple[str, ...]:
    found = [str(ip) for nic in row.get("guest.net") or () for ip in nic.ipAddress or ()]
    return routable_addresses(found)


def virtual_disks(row: Mapping[str, Any]) -> list[Any]:
    devices = row.get("config.hardware.device") or ()
    return [device for device in devices if isinstance(device, vim.vm.device.VirtualDisk)]


def vm_info(row: Mapping[str, Any]) -> VMInfo:
    """A row with properties.VM_PROPERTIES as ListVMs reports it."""
    devices = row.get("config.hardware.device") or ()
    nics = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)]
    return VMInfo(
        id=vm_id(row),
        name=str(row.get("name", "")),
        power_state=power_state(row),
        ips=ips(row),
        cpu=int(row.get("config.hardware.numCPU") or 0),
        memory_mib=int(row.get("config.hardware.memoryMB") or 0),
        disks=tuple(
            DiskInfo(
                id=str(disk.key),
                path=str(disk.backing.fileName),
                size_gib=int(disk.capacityInKB) // (1024 * 1024),
                format="vmdk",
            )
            for disk in virtual_disks(row)
        ),
        networks=tuple(
            NetworkInfo(
                name=str(nic.deviceInfo.summary if nic.deviceInfo else ""),
                mac=str(nic.macAddress or ""),
            )
            for nic in nics
        ),
    )
