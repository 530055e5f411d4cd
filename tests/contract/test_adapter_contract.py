"""Behaviour every hypervisor adapter must show, written once against the ports."""

from __future__ import annotations

import pytest
from returns.result import Result, Success

from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import (
    CloneRequest,
    DiskDefaults,
    DiskQuery,
    DiskSpec,
    ImageSource,
    OwnerMark,
    PrepareImageRequest,
    SnapshotRequest,
    VMChanges,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef, TaskState

from contract.harness import Harness, made
from support import error_kind, ok

MISSING_IDS = ["", "no-such-vm", "00000000-0000-0000-0000-000000000000", "../../etc", "\x00x"]


def create(harness: Harness, owner: OwnerMark, name: str, **changes: object) -> str:
    return made(
        harness.adapter, harness.adapter.start_create(harness.request(name, **changes), owner)
    )


def finished(harness: Harness, result: Result[TaskRef | None, ProviderError]) -> None:
    """A change is done within the call (None) or hands back a task that the adapter's own
    tracker answers; every backend here has finished it by then (the vSphere simulator ends
    each Task before its call returns), so the task must already read done."""
    task = ok(result)
    if task is not None:
        assert harness.adapter.task_state(task.id) == TaskState.succeeded()


def test_a_new_vm_is_powered_off_and_found_by_name(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-a")
    assert ok(harness.adapter.power_state(vm_id)) is PowerState.OFF
    record = ok(harness.adapter.find_by_name("contract-a"))
    assert record is not None
    assert (record.id, record.owner) == (vm_id, owner)
    description = ok(harness.adapter.describe(vm_id))
    assert description is not None
    assert description.power_state is PowerState.OFF


def test_create_of_an_existing_own_name_returns_the_same_vm(
    harness: Harness, owner: OwnerMark
) -> None:
    first = create(harness, owner, "contract-twice")
    assert create(harness, owner, "contract-twice") == first
    assert [vm.id for vm in ok(harness.adapter.list_vms())].count(first) == 1


def test_create_of_a_name_owned_by_another_provider_is_already_exists(
    harness: Harness, owner: OwnerMark
) -> None:
    create(harness, OwnerMark(provider="someone/else"), "contract-clash")
    result = harness.adapter.start_create(harness.request("contract-clash"), owner)
    assert error_kind(result) is ErrorKind.ALREADY_EXISTS


def test_a_blank_image_gives_a_blank_root_disk_of_the_requested_size(
    harness: Harness, owner: OwnerMark
) -> None:
    vm_class = VMClass(cpu=2, memory_mib=512, disk_defaults=DiskDefaults(size_gib=7))
    if not harness.blank_images:
        # A backend that cannot make a blank disk must refuse, naming the image, and make nothing.
        blank = harness.request("contract-blank", vm_class=vm_class, image=VMImage())
        assert error_kind(harness.adapter.start_create(blank, owner)) is ErrorKind.INVALID_SPEC
        assert ok(harness.adapter.find_by_name("contract-blank")) is None
        return
    vm_id = create(harness, owner, "contract-blank", vm_class=vm_class)
    info = ok(harness.adapter.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (2, 512)
    assert info.disks[0].size_gib == 7
    details = ok(harness.adapter.disk_details(DiskQuery(vm_id=vm_id)))
    assert details.backing_file == ""
    assert details.is_bootable


def test_extra_disks_are_attached(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-disks", disks=(DiskSpec(size_gib=3),))
    info = ok(harness.adapter.vm_info(vm_id))
    assert info is not None
    assert [disk.size_gib for disk in info.disks][1:] == [3]


def test_vms_from_one_image_never_share_a_writable_disk(harness: Harness, owner: OwnerMark) -> None:
    first = create(harness, owner, "contract-img-1", image=harness.image)
    second = create(harness, owner, "contract-img-2", image=harness.image)
    paths = [
        ok(harness.adapter.disk_details(DiskQuery(vm_id=vm_id))).path for vm_id in (first, second)
    ]
    assert paths[0] != paths[1]
    assert harness.image.path not in paths


def test_an_image_that_does_not_exist_is_an_invalid_spec(
    harness: Harness, owner: OwnerMark
) -> None:
    request = harness.request(
        "contract-noimg", image=harness.image.model_copy(update={"path": "/images/missing.qcow2"})
    )
    assert error_kind(harness.adapter.start_create(request, owner)) is ErrorKind.INVALID_SPEC
    assert ok(harness.adapter.find_by_name("contract-noimg")) is None


@pytest.mark.parametrize("vm_id", MISSING_IDS)
def test_ids_that_name_nothing_are_missing(harness: Harness, vm_id: str) -> None:
    assert ok(harness.adapter.describe(vm_id)) is None
    assert ok(harness.adapter.vm_info(vm_id)) is None
    assert error_kind(harness.adapter.delete(vm_id)) is ErrorKind.NOT_FOUND
    assert error_kind(harness.adapter.power_state(vm_id)) is ErrorKind.NOT_FOUND
    assert error_kind(harness.adapter.power_on(vm_id)) is ErrorKind.NOT_FOUND


def test_delete_removes_the_vm(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-delete")
    ok(harness.adapter.delete(vm_id))
    assert ok(harness.adapter.describe(vm_id)) is None
    assert ok(harness.adapter.find_by_name("contract-delete")) is None
    assert vm_id not in [vm.id for vm in ok(harness.adapter.list_vms())]


def test_power_transitions_are_idempotent(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-power")
    finished(harness, harness.adapter.power_on(vm_id))
    finished(harness, harness.adapter.power_on(vm_id))
    assert ok(harness.adapter.power_state(vm_id)) is PowerState.ON
    finished(harness, harness.adapter.reboot(vm_id))
    assert ok(harness.adapter.power_state(vm_id)) is PowerState.ON
    finished(harness, harness.adapter.power_off(vm_id))
    finished(harness, harness.adapter.power_off(vm_id))
    assert ok(harness.adapter.power_state(vm_id)) is PowerState.OFF


def test_a_running_vm_reports_guest_addresses(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-ips")
    finished(harness, harness.adapter.power_on(vm_id))
    description = ok(harness.adapter.describe(vm_id))
    assert description is not None
    assert description.power_state is PowerState.ON
    if harness.guest_reports_addresses:
        assert description.ips
    else:
        # No guest OS, so no lease and no agent: reporting no address is the honest answer.
        assert description.ips == ()
    assert dict(description.raw)


def test_a_shutdown_request_records_its_deadline_on_the_vm(
    harness: Harness, owner: OwnerMark
) -> None:
    vm_id = create(harness, owner, "contract-shutdown")
    finished(harness, harness.adapter.power_on(vm_id))
    assert ok(harness.adapter.shutdown_deadline(vm_id)) is None
    deadline = int(harness.clock.now()) + 60
    ok(harness.adapter.request_shutdown(vm_id, deadline))
    assert ok(harness.adapter.shutdown_deadline(vm_id)) == deadline
    ok(harness.adapter.clear_shutdown_deadline(vm_id))
    assert ok(harness.adapter.shutdown_deadline(vm_id)) is None


def test_reconfigure_changes_what_was_asked(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-reconf", disks=(DiskSpec(size_gib=2),))
    finished(harness, harness.adapter.reconfigure(vm_id, VMChanges(cpu=3, memory_mib=1024)))
    info = ok(harness.adapter.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (3, 1024)
    listed = next(vm for vm in ok(harness.adapter.list_vms()) if vm.id == vm_id)
    assert (listed.cpu, listed.memory_mib) == (3, 1024)
    sizes_before = [disk.size_gib for disk in info.disks]

    grown = harness.adapter.reconfigure(
        vm_id, VMChanges(root_disk_gib=30, disks=(DiskSpec(size_gib=5),))
    )
    info = ok(harness.adapter.vm_info(vm_id))
    assert info is not None
    if isinstance(grown, Success):
        finished(harness, grown)
        assert [disk.size_gib for disk in info.disks] == [30, 5]
    else:
        # A backend whose driver cannot resize volumes (libvirt's test driver) must say so
        # as UNSUPPORTED and change nothing: never report success for a change not made.
        assert error_kind(grown) is ErrorKind.UNSUPPORTED
        assert [disk.size_gib for disk in info.disks] == sizes_before


def test_snapshot_revert_restores_cpu_and_memory(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-snap")
    snapshot = ok(harness.adapter.create_snapshot(SnapshotRequest(vm_id=vm_id, name="before")))
    finished(harness, harness.adapter.reconfigure(vm_id, VMChanges(cpu=4, memory_mib=2048)))
    finished(harness, harness.adapter.revert_snapshot(vm_id, snapshot.id))
    info = ok(harness.adapter.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (1, 256)
    finished(harness, harness.adapter.delete_snapshot(vm_id, snapshot.id))
    assert error_kind(harness.adapter.revert_snapshot(vm_id, snapshot.id)) is ErrorKind.NOT_FOUND


def test_unknown_snapshots_are_not_found(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-nosnap")
    assert error_kind(harness.adapter.delete_snapshot(vm_id, "nope")) is ErrorKind.NOT_FOUND
    assert error_kind(harness.adapter.revert_snapshot("missing", "nope")) is ErrorKind.NOT_FOUND


@pytest.mark.parametrize("linked", [False, True])
def test_clone_makes_a_new_vm_with_its_own_disks(
    harness: Harness, owner: OwnerMark, linked: bool
) -> None:
    source = create(harness, owner, "contract-src", image=harness.image)
    if linked and not harness.adapter.capabilities().supports_linked_clones:
        # The capability gates linked clones: a backend without it must refuse them.
        request = CloneRequest(source_vm_id=source, target_name="contract-copy", linked=True)
        assert error_kind(harness.adapter.start_clone(request, owner)) is ErrorKind.UNSUPPORTED
        return
    if linked:
        ok(harness.adapter.create_snapshot(SnapshotRequest(vm_id=source, name="base")))
    target = made(
        harness.adapter,
        harness.adapter.start_clone(
            CloneRequest(source_vm_id=source, target_name="contract-copy", linked=linked, cpu=2),
            owner,
        ),
    )
    assert target != source
    source_disk = ok(harness.adapter.disk_details(DiskQuery(vm_id=source)))
    target_disk = ok(harness.adapter.disk_details(DiskQuery(vm_id=target)))
    assert target_disk.path != source_disk.path
    assert (target_disk.backing_file == source_disk.path) is linked
    info = ok(harness.adapter.vm_info(target))
    assert info is not None
    assert (info.name, info.cpu, info.power_state) == ("contract-copy", 2, PowerState.OFF)


def test_clone_of_a_missing_source_is_not_found(harness: Harness, owner: OwnerMark) -> None:
    result = harness.adapter.start_clone(
        CloneRequest(source_vm_id="missing", target_name="x"), owner
    )
    assert error_kind(result) is ErrorKind.NOT_FOUND


def test_prepare_image_is_idempotent_and_usable(harness: Harness, owner: OwnerMark) -> None:
    request = PrepareImageRequest(
        source=ImageSource(path=harness.image.path), target_name="contract-prepared"
    )
    if not harness.adapter.capabilities().supports_image_import:
        # The capability is what gates ImagePrepare: a backend without it must refuse.
        assert error_kind(harness.adapter.prepare_image(request)) is ErrorKind.UNSUPPORTED
        return
    first = ok(harness.adapter.prepare_image(request))
    assert ok(harness.adapter.prepare_image(request)) == first
    vm_id = create(
        harness,
        owner,
        "contract-from-prepared",
        image=harness.image.model_copy(update={"path": first.path}),
    )
    assert ok(harness.adapter.disk_details(DiskQuery(vm_id=vm_id))).path != first.path


def test_health_and_capabilities_answer(harness: Harness) -> None:
    assert harness.adapter.check().ok
    capabilities = harness.adapter.capabilities()
    assert capabilities.supports_snapshots or not capabilities.supports_memory_snapshots


def test_a_finished_create_leaves_no_unfinished_vm(harness: Harness, owner: OwnerMark) -> None:
    vm_id = create(harness, owner, "contract-finished")
    record = ok(harness.adapter.find_by_name("contract-finished"))
    assert record is not None
    assert (record.id, record.building_since) == (vm_id, None)
    assert ok(harness.adapter.find_unfinished()) == []
