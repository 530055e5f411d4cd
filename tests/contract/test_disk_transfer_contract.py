"""Disk facts (GetDiskInfo) of what Create makes, on every backend that has the disk port."""

from __future__ import annotations

from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import DiskDefaults, DiskQuery, OwnerMark, VMClass, VMImage

from contract.harness import Harness
from contract.steps import create, disks
from support import error_kind, ok


def test_a_blank_image_gives_a_blank_root_disk_of_the_requested_size(
    disk_transfer_harness: Harness, owner: OwnerMark
) -> None:
    harness = disk_transfer_harness
    vm_class = VMClass(cpu=2, memory_mib=512, disk_defaults=DiskDefaults(size_gib=7))
    if not harness.blank_images:
        # A backend that cannot make a blank disk must refuse, naming the image, and make nothing.
        blank = harness.request("contract-blank", vm_class=vm_class, image=VMImage())
        result = harness.backend.lifecycle.start_create(blank, owner)
        assert error_kind(result) is ErrorKind.INVALID_SPEC
        assert ok(harness.backend.lifecycle.find_by_name("contract-blank")) is None
        return
    vm_id = create(harness, owner, "contract-blank", vm_class=vm_class)
    info = ok(harness.backend.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (2, 512)
    assert info.disks[0].size_gib == 7
    details = ok(disks(harness).disk_details(DiskQuery(vm_id=vm_id)))
    assert details.backing_file == ""
    assert details.is_bootable


def test_vms_from_one_image_never_share_a_writable_disk(
    disk_transfer_harness: Harness, owner: OwnerMark
) -> None:
    harness = disk_transfer_harness
    first = create(harness, owner, "contract-img-1", image=harness.image)
    second = create(harness, owner, "contract-img-2", image=harness.image)
    paths = [
        ok(disks(harness).disk_details(DiskQuery(vm_id=vm_id))).path for vm_id in (first, second)
    ]
    assert paths[0] != paths[1]
    assert harness.image.path not in paths
