"""What a vSphere export refuses before a byte moves, and what it says it leaves behind: read
from real pyVmomi device objects, as the property collector returns them."""

from __future__ import annotations

from typing import Any

import pytest
from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.disk_transfer import preflight
from pyrigaud.domain.disk_images import LeftBehind
from pyrigaud.domain.errors import ErrorKind

from support import error_of, ok

vim: Any = untyped_vim  # pyVmomi's data-object constructors are untyped


def _disk(key: int, backing: Any) -> Any:
    return vim.vm.device.VirtualDisk(key=key, backing=backing, capacityInKB=1024)


def _flat(**fields: object) -> Any:
    return vim.vm.device.VirtualDisk.FlatVer2BackingInfo(fileName="[ds] vm/vm.vmdk", **fields)


@pytest.mark.parametrize(
    ("backing", "problem"),
    [
        (_flat(diskMode="independent_persistent"), "independent"),
        (
            vim.vm.device.VirtualDisk.RawDiskMappingVer1BackingInfo(
                fileName="[ds] vm/rdm.vmdk", compatibilityMode="physicalMode"
            ),
            "raw device mapping",
        ),
        (_flat(diskMode="persistent", sharing="sharingMultiWriter"), "shared"),
    ],
)
def test_a_disk_no_lease_can_give_at_one_point_in_time_is_refused(
    backing: Any, problem: str
) -> None:
    disk = _disk(2000, backing)
    refused = error_of(preflight("web", disk, {"config.hardware.device": [disk]}))
    assert refused.kind is ErrorKind.FAILED_PRECONDITION
    assert problem in refused.message
    assert "disk 2000" in refused.message


def test_a_vm_with_pci_passthrough_devices_is_refused() -> None:
    disk = _disk(2000, _flat(diskMode="persistent"))
    passthrough = vim.vm.device.VirtualPCIPassthrough(key=13000)
    refused = error_of(preflight("gpu", disk, {"config.hardware.device": [disk, passthrough]}))
    assert refused.kind is ErrorKind.FAILED_PRECONDITION
    assert "PCI passthrough" in refused.message


def test_what_the_moved_disk_does_not_carry_is_told() -> None:
    first = _disk(2000, _flat(diskMode="persistent", sharing="sharingNone"))
    second = _disk(2001, _flat(diskMode="persistent"))
    row = {
        "config.hardware.device": [first, second, vim.vm.device.VirtualTPM(key=11000)],
        "config.firmware": "efi",
    }
    assert ok(preflight("web", first, row)) == (
        LeftBehind.OTHER_DISKS,
        LeftBehind.TPM,
        LeftBehind.NVRAM,
    )
    alone = {"config.hardware.device": [first], "config.firmware": "bios"}
    assert ok(preflight("web", first, alone)) == ()
