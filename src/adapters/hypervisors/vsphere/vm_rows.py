"""What a VM's property-collector row says, as domain values, and the marks pyrigaud keeps in
a VM's extraConfig."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.device_models import shown_models
from pyrigaud.adapters.hypervisors.vsphere.properties import extra_config
from pyrigaud.application.ports import Clock
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskInfo, NetworkInfo, OwnerMark, VMInfo, VMRecord
from pyrigaud.domain.power import PowerState

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

OWNER_KEY = "pyrigaud.owner"
# Unix time a Create (or Clone) made in several steps began; removed once the VM is complete.
BUILDING_KEY = "pyrigaud.building"
SHUTDOWN_DEADLINE_KEY = "pyrigaud.shutdownDeadline"
RECORD_PROPERTIES = ("name", "config.extraConfig", "config.instanceUuid")


def building_marks(owner: str, now: float) -> dict[str, str]:
    """The marks of a VM made in steps: this provider's, building since `now` (whole seconds,
    rounded down: the mark never claims a start later than the real one). A VM still so marked
    once the leftover deadline passed is removed by the sweep."""
    return {OWNER_KEY: owner, BUILDING_KEY: str(int(now))}


@dataclass(frozen=True)
class ImportMarks:
    """The marks a VM made by an NFC import carries until it is complete (ImagePrepare's
    template, ImportDisk's transient VM), dated by the wall clock every replica shares."""

    owner: str
    clock: Clock

    def building(self) -> dict[str, str]:
        return building_marks(self.owner, self.clock.now())

    @staticmethod
    def refuse_unfinished(record: VMRecord, doing: str) -> Result[None, ProviderError]:
        """UNAVAILABLE for a VM of the name whose import has not finished: in progress, or
        cut off (the leftover sweep removes it once the deadline passed); a retry then works."""
        if record.building_since is not None:
            return Failure(
                ProviderError.unavailable(
                    f"{doing} {record.name!r} has not finished (a provider was importing it, "
                    "or was stopped part-way: the leftover sweep removes that); retry later"
                )
            )
        return Success(None)


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
    """Every address the guest reports (DescribeVM and ListVMs keep those shown)."""
    return tuple(str(ip) for nic in row.get("guest.net") or () for ip in nic.ipAddress or ())


def virtual_disks(row: Mapping[str, Any]) -> list[Any]:
    devices = row.get("config.hardware.device") or ()
    return [device for device in devices if isinstance(device, vim.vm.device.VirtualDisk)]


def disk_index(disks: list[Any], disk_id: str, vm: str) -> Result[int, ProviderError]:
    """The position of the disk named by device key (the first when none is named), as
    ExportDisk and GetDiskInfo name a disk."""
    for index, disk in enumerate(disks):
        if not disk_id or str(disk.key) == disk_id:
            return Success(index)
    missing = f"no disk {disk_id!r}" if disk_id else "no disks"
    return Failure(ProviderError.not_found(f"VM {vm!r} has {missing}"))


class VMEntry(NamedTuple):
    """What ListVMs and Describe show of one VM, in plain values: the inventory cache keeps
    10,000s of these, so no pyVmomi object and no per-entry dict."""

    moref: str
    id: str
    name: str
    on: bool
    ips: tuple[str, ...]
    cpu: int
    memory_mib: int
    disks: tuple[tuple[str, str, int], ...]  # (device key, backing file, size GiB)
    nics: tuple[tuple[str, str], ...]  # (network summary, MAC)
    disk_controller: str  # the first disk's, in the domain's words (device_models.py)
    nic_models: str  # comma-joined, in device order

    def info(self) -> VMInfo:
        return VMInfo(
            id=self.id,
            name=self.name,
            power_state=PowerState.ON if self.on else PowerState.OFF,
            ips=self.ips,
            cpu=self.cpu,
            memory_mib=self.memory_mib,
            disks=tuple(
                DiskInfo(id=key, path=path, size_gib=size, format="vmdk")
                for key, path, size in self.disks
            ),
            networks=tuple(NetworkInfo(name=name, mac=mac) for name, mac in self.nics),
        )


def vm_entry(row: Mapping[str, Any]) -> VMEntry:
    """A row with properties.VM_PROPERTIES as the inventory keeps it."""
    devices = row.get("config.hardware.device") or ()
    nics = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)]
    disk_controller, nic_models = shown_models(devices)
    return VMEntry(
        moref=str(row["_ref"]._moId),
        id=vm_id(row),
        name=str(row.get("name", "")),
        on=power_state(row) is PowerState.ON,
        ips=ips(row),
        cpu=int(row.get("config.hardware.numCPU") or 0),
        memory_mib=int(row.get("config.hardware.memoryMB") or 0),
        disks=tuple(
            (str(disk.key), str(disk.backing.fileName), int(disk.capacityInKB) // (1024 * 1024))
            for disk in virtual_disks(row)
        ),
        nics=tuple(
            (str(nic.deviceInfo.summary if nic.deviceInfo else ""), str(nic.macAddress or ""))
            for nic in nics
        ),
        disk_controller=disk_controller,
        nic_models=nic_models,
    )


def vm_info(row: Mapping[str, Any]) -> VMInfo:
    """A row with properties.VM_PROPERTIES as ListVMs reports it."""
    return vm_entry(row).info()
