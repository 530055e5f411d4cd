"""VMLifecycle: making, finding, changing and removing VMs, on every backend."""

from __future__ import annotations

import pytest
from returns.result import Success

from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import DiskSpec, OwnerMark, VMChanges
from pyrigaud.domain.power import PowerState

from contract.harness import Harness, made
from contract.steps import MISSING_IDS, create, finished
from support import error_kind, ok


def test_a_new_vm_is_powered_off_and_found_by_name(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-a")
    assert ok(harness.backend.power.power_state(vm_id)) is PowerState.OFF
    record = ok(harness.backend.lifecycle.find_by_name("contract-a"))
    assert record is not None
    assert (record.id, record.owner) == (vm_id, owner)
    description = ok(harness.backend.inventory.describe(vm_id))
    assert description is not None
    assert description.power_state is PowerState.OFF


def test_the_backend_refuses_a_taken_name_and_reports_its_owner(
    harness: Harness, owner: OwnerMark
) -> None:
    """Adapters never adopt: a second start_create of a name is ALREADY_EXISTS, and
    find_by_name reports whose VM holds it, for the application's rule to decide."""
    first = create(harness, owner, "contract-taken")
    result = harness.backend.lifecycle.start_create(harness.request("contract-taken"), owner)
    assert error_kind(result) is ErrorKind.ALREADY_EXISTS
    record = ok(harness.backend.lifecycle.find_by_name("contract-taken"))
    assert record is not None
    assert (record.id, record.owner) == (first, owner)


def test_create_of_an_existing_own_name_returns_the_same_vm(
    harness: Harness, owner: OwnerMark
) -> None:
    create_vm = CreateVM(harness.backend.lifecycle, harness.ownership(owner))
    first = made(harness.backend.tasks, create_vm(harness.request("contract-twice")))
    assert made(harness.backend.tasks, create_vm(harness.request("contract-twice"))) == first
    listed = [vm.id for vm in ok(harness.backend.inventory.list_vms())]
    assert listed.count(first) == 1


def test_create_of_a_name_owned_by_another_provider_is_already_exists(
    harness: Harness, owner: OwnerMark
) -> None:
    create(harness, OwnerMark(provider="someone/else"), "contract-clash")
    create_vm = CreateVM(harness.backend.lifecycle, harness.ownership(owner))
    assert error_kind(create_vm(harness.request("contract-clash"))) is ErrorKind.ALREADY_EXISTS


def test_extra_disks_are_attached(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-disks", disks=(DiskSpec(size_gib=3),))
    info = ok(harness.backend.inventory.vm_info(vm_id))
    assert info is not None
    assert [disk.size_gib for disk in info.disks][1:] == [3]


def test_an_image_that_does_not_exist_is_an_invalid_spec(
    harness: Harness, owner: OwnerMark
) -> None:
    missing = harness.image.model_copy(update={"path": "/images/missing.qcow2"})
    request = harness.request("contract-noimg", image=missing)
    result = harness.backend.lifecycle.start_create(request, owner)
    assert error_kind(result) is ErrorKind.INVALID_SPEC
    assert ok(harness.backend.lifecycle.find_by_name("contract-noimg")) is None


@pytest.mark.parametrize("vm_id", MISSING_IDS)
def test_ids_that_name_nothing_are_missing(harness: Harness, vm_id: str) -> None:
    assert ok(harness.backend.inventory.describe(vm_id)) is None
    assert ok(harness.backend.inventory.vm_info(vm_id)) is None
    assert error_kind(harness.backend.lifecycle.delete(vm_id)) is ErrorKind.NOT_FOUND
    assert error_kind(harness.backend.power.power_state(vm_id)) is ErrorKind.NOT_FOUND
    assert error_kind(harness.backend.power.power_on(vm_id)) is ErrorKind.NOT_FOUND


def test_delete_removes_the_vm(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-delete")
    ok(harness.backend.lifecycle.delete(vm_id))
    assert ok(harness.backend.inventory.describe(vm_id)) is None
    assert ok(harness.backend.lifecycle.find_by_name("contract-delete")) is None
    assert vm_id not in [vm.id for vm in ok(harness.backend.inventory.list_vms())]


def test_reconfigure_changes_what_was_asked(harness: Harness, owner: OwnerMark) -> None:
    lifecycle, inventory = harness.backend.lifecycle, harness.backend.inventory
    vm_id = create(harness, owner, "contract-reconf", disks=(DiskSpec(size_gib=2),))
    finished(harness, lifecycle.reconfigure(vm_id, VMChanges(cpu=3, memory_mib=1024)))
    info = ok(inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (3, 1024)
    listed = next(vm for vm in ok(inventory.list_vms()) if vm.id == vm_id)
    assert (listed.cpu, listed.memory_mib) == (3, 1024)
    sizes_before = [disk.size_gib for disk in info.disks]

    grown = lifecycle.reconfigure(vm_id, VMChanges(root_disk_gib=30, disks=(DiskSpec(size_gib=5),)))
    info = ok(inventory.vm_info(vm_id))
    assert info is not None
    if isinstance(grown, Success):
        finished(harness, grown)
        assert [disk.size_gib for disk in info.disks] == [30, 5]
    else:
        # A backend whose driver cannot resize volumes (libvirt's test driver) must say so
        # as UNSUPPORTED and change nothing: never report success for a change not made.
        assert error_kind(grown) is ErrorKind.UNSUPPORTED
        assert [disk.size_gib for disk in info.disks] == sizes_before


def test_a_finished_create_leaves_no_unfinished_vm(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-finished")
    record = ok(harness.backend.lifecycle.find_by_name("contract-finished"))
    assert record is not None
    assert (record.id, record.building_since) == (vm_id, None)
    assert ok(harness.backend.lifecycle.find_unfinished()) == []
