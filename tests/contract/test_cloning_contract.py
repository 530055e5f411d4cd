"""Cloning, on every backend that has the port."""

from __future__ import annotations

import pytest

from pyrigaud.application.ports import Cloning
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import CloneRequest, DiskQuery, OwnerMark, SnapshotRequest
from pyrigaud.domain.power import PowerState

from contract.harness import Harness, made
from contract.steps import create, disks
from support import error_kind, ok


def cloning_of(harness: Harness) -> Cloning:
    assert harness.backend.cloning is not None
    return harness.backend.cloning


@pytest.mark.parametrize("linked", [False, True])
def test_clone_makes_a_new_vm_with_its_own_disks(
    cloning_harness: Harness, owner: OwnerMark, linked: bool
) -> None:
    harness = cloning_harness
    cloning = cloning_of(harness)
    source = create(harness, owner, "contract-src", image=harness.image)
    if linked and not harness.backend.capabilities.capabilities().supports_linked_clones:
        # The capability gates linked clones: a backend without it must refuse them.
        request = CloneRequest(source_vm_id=source, target_name="contract-copy", linked=True)
        assert error_kind(cloning.start_clone(request, owner)) is ErrorKind.UNSUPPORTED
        return
    if linked:
        assert harness.backend.snapshots is not None, "linked clones start from a snapshot"
        ok(harness.backend.snapshots.create_snapshot(SnapshotRequest(vm_id=source, name="base")))
    request = CloneRequest(source_vm_id=source, target_name="contract-copy", linked=linked, cpu=2)
    target = made(harness.backend.tasks, cloning.start_clone(request, owner))
    assert target != source
    source_disk = ok(disks(harness).disk_details(DiskQuery(vm_id=source)))
    target_disk = ok(disks(harness).disk_details(DiskQuery(vm_id=target)))
    assert target_disk.path != source_disk.path
    assert (target_disk.backing_file == source_disk.path) is linked
    info = ok(harness.backend.inventory.vm_info(target))
    assert info is not None
    assert (info.name, info.cpu, info.power_state) == ("contract-copy", 2, PowerState.OFF)


def test_clone_of_a_missing_source_is_not_found(cloning_harness: Harness, owner: OwnerMark) -> None:
    request = CloneRequest(source_vm_id="missing", target_name="x")
    assert error_kind(cloning_of(cloning_harness).start_clone(request, owner)) is (
        ErrorKind.NOT_FOUND
    )
