"""The hypervisor-independent rules, exercised on the fake hypervisor."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import pytest
from returns.result import Failure, Result, Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.fake.backend import fake_backend
from pyrigaud.adapters.hypervisors.fake.capabilities import FakeCapabilities
from pyrigaud.adapters.hypervisors.fake.cloning import FakeCloning
from pyrigaud.adapters.hypervisors.fake.hypervisor import FAKE_CAPABILITIES, FakeHypervisor
from pyrigaud.adapters.hypervisors.fake.provisioning import FakeVMLifecycle
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.adapters.staging.s3_location import S3
from pyrigaud.application.backend import Backend
from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ownership import (
    POLL_SECONDS,
    WAIT_FOR_OTHER_CREATE_SECONDS,
    OwnershipRule,
)
from pyrigaud.application.ports import VMLifecycle
from pyrigaud.application.ports.disk_transfer import TransferWatch
from pyrigaud.application.ports.staging import (
    StagedFile,
    StagedReader,
    StagedWriter,
    StagingStores,
)
from pyrigaud.application.ports.transfer_metrics import TransferPhase
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.application.use_cases.capabilities import TransferClaims
from pyrigaud.application.use_cases.clone_vm import CloneVM
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.application.use_cases.delete_vm import DeleteVM
from pyrigaud.application.use_cases.describe_vm import DescribeVM, ListVMs
from pyrigaud.application.use_cases.export_disk import ExportDisk
from pyrigaud.application.use_cases.import_disk import ImportDisk
from pyrigaud.application.use_cases.power_vm import STALE_SHUTDOWN_SECONDS, PowerVM
from pyrigaud.application.use_cases.prepare_image import PrepareImage
from pyrigaud.application.use_cases.reconfigure_vm import ReconfigureVM, UpgradeHardware
from pyrigaud.application.use_cases.snapshots import (
    CreateSnapshot,
    DeleteSnapshot,
    RevertSnapshot,
)
from pyrigaud.application.use_cases.sweep_leftovers import SweepLeftovers
from pyrigaud.application.use_cases.task_status import TaskStatus
from pyrigaud.application.use_cases.transfers import TransferContext
from pyrigaud.domain import fields
from pyrigaud.domain.disk_images import LeftBehind
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.leftovers import CREATE_DEADLINE_SECONDS, LeftoverPolicy
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    DiskRead,
    DiskSpec,
    ExportRequest,
    ExportResult,
    Firmware,
    ImageSource,
    ImportRequest,
    ImportResult,
    OwnerMark,
    PrepareImageRequest,
    SecurityProfile,
    SnapshotRequest,
    StagingType,
    TransferMode,
    VMChanges,
    VMClass,
    VMRecord,
)
from pyrigaud.domain.power import PowerOp, PowerState
from pyrigaud.domain.staging import StagedLocation, StagedSweep
from pyrigaud.domain.tasks import ShutdownTask, TaskRef
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

import support.transfer as transfers
from support import ManualClock, error_kind, error_of, ok
from support.transfer import IMAGE_JUDGE, LOOPBACK_GATE, disk_moves, staged

OWNER = OwnerMark(provider="ns/provider")
P = TypeVar("P")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fake(clock: ManualClock) -> FakeHypervisor:
    return FakeHypervisor(clock, latency_clock=SystemClock())  # real races


@pytest.fixture
def backend(fake: FakeHypervisor) -> Backend:
    return fake_backend(fake)


@pytest.fixture
def staging(tmp_path: Path, clock: ManualClock) -> StagingStores:
    """Staging on PVC `m`, mounted under a temporary root."""
    (tmp_path / "m").mkdir()
    return STAGING_TYPES.stores("tests/unit", clock, str(tmp_path))


def served(port: P | None) -> P:
    """An optional port, which the fake backend always serves."""
    assert port is not None
    return port


def request(name: str = "vm-1", cpu: int = 2, memory: int = 1024, **extra: object) -> CreateRequest:
    return CreateRequest(name=name, vm_class=VMClass(cpu=cpu, memory_mib=memory), **extra)


def ownership(lifecycle: VMLifecycle, clock: ManualClock | None = None) -> OwnershipRule:
    """One replica's rule: its own name locks, shared with no other replica."""
    return OwnershipRule(
        lifecycle, OWNER, clock or ManualClock(), LeftoverPolicy(owner=OWNER), KeyedLock()
    )


def create_vm(backend: Backend, clock: ManualClock | None = None) -> CreateVM:
    return CreateVM(backend.lifecycle, ownership(backend.lifecycle, clock))


def clone_vm(backend: Backend) -> CloneVM:
    return CloneVM(served(backend.cloning), backend.capabilities, ownership(backend.lifecycle))


def create(backend: Backend, name: str = "vm-1", **extra: Any) -> str:
    return ok(create_vm(backend)(request(name, **extra))).id


# --- Create / Delete / Describe ---------------------------------------------------------------


def test_create_is_idempotent_by_name(backend: Backend) -> None:
    use_case = create_vm(backend)
    first = ok(use_case(request()))
    second = ok(use_case(request(cpu=8)))  # spec differences are Reconfigure's job
    assert first.id == second.id
    assert first.task is None
    assert len(ok(backend.inventory.list_vms())) == 1


def test_secure_boot_without_uefi_is_refused_before_any_backend(backend: Backend) -> None:
    """One rule for every hypervisor, decided in the domain: the backend is never asked."""
    bios = VMClass(cpu=1, memory_mib=256, security=SecurityProfile(secure_boot=True))
    error = error_of(create_vm(backend)(CreateRequest(name="bios-secure", vm_class=bios)))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.field == fields.CLASS_SECURE_BOOT
    assert for_the_manager(error) == "class_json.SecurityProfile.SecureBoot: needs firmware UEFI"
    assert ok(backend.lifecycle.find_by_name("bios-secure")) is None
    uefi = bios.model_copy(update={"firmware": Firmware.UEFI})
    assert uefi.refusal() is None
    ok(create_vm(backend)(CreateRequest(name="uefi-secure", vm_class=uefi)))


@pytest.mark.parametrize("foreign_owner", [None, OwnerMark(provider="other/provider")])
def test_a_name_this_provider_does_not_own_is_already_exists(
    fake: FakeHypervisor, backend: Backend, foreign_owner: OwnerMark | None
) -> None:
    fake.add_foreign_vm("taken", owner=foreign_owner)
    error = error_of(create_vm(backend)(request("taken")))
    assert error.kind is ErrorKind.ALREADY_EXISTS
    assert "taken" in error.message


def test_concurrent_creates_of_one_name_make_exactly_one_vm(
    fake: FakeHypervisor, backend: Backend
) -> None:
    fake.faults.slow("create", 0.05)
    use_case = create_vm(backend)
    ids: list[str] = []
    barrier = threading.Barrier(8)

    def run() -> None:
        barrier.wait()
        ids.append(ok(use_case(request("racy"))).id)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 1
    assert len(ids) == 8
    assert len(ok(backend.inventory.list_vms())) == 1


@dataclass(frozen=True)
class TaskingLifecycle(FakeVMLifecycle):
    """A Create that goes on in a task after the call, as vSphere's does."""

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        return super().start_create(request, owner).map(_in_a_task)


@dataclass(frozen=True)
class TaskingCloning(FakeCloning):
    """A Clone that goes on in a task after the call, as vSphere's does."""

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        return super().start_clone(request, owner).map(_in_a_task)


def _in_a_task(vm: CreatedVM) -> CreatedVM:
    return vm.model_copy(update={"task": TaskRef(id=f"making:{vm.id}")})


def test_create_and_clone_hand_back_the_task_making_the_vm(fake: FakeHypervisor) -> None:
    backend = replace(
        fake_backend(fake), lifecycle=TaskingLifecycle(fake), cloning=TaskingCloning(fake)
    )
    created = ok(create_vm(backend)(request("tasked")))
    assert created.task == TaskRef(id=f"making:{created.id}")
    copy = ok(clone_vm(backend)(CloneRequest(source_vm_id=created.id, target_name="tasked-2")))
    assert copy.task == TaskRef(id=f"making:{copy.id}")
    # A VM already there is returned as it is: nothing is being made any more.
    assert ok(create_vm(backend)(request("tasked"))) == CreatedVM(id=created.id)


def test_a_second_replica_adopts_a_vm_it_did_not_see_being_made(backend: Backend) -> None:
    """Two replicas share no lock: each looks at the hypervisor, where the owner mark decides."""
    replica_a, replica_b = create_vm(backend), create_vm(backend)
    vm_id = ok(replica_a(request("shared"))).id
    assert ok(replica_b(request("shared"))).id == vm_id
    assert len(ok(backend.inventory.list_vms())) == 1


@dataclass(frozen=True)
class RacedLifecycle(FakeVMLifecycle):
    """Another replica, marking its VMs `racer`, makes a VM of the requested name between this
    replica's look at the name and its own start_create (the two share no lock)."""

    racer: OwnerMark

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        ok(FakeVMLifecycle(self.hypervisor).start_create(request, self.racer))
        return super().start_create(request, owner)


def test_a_create_that_loses_a_race_to_another_replica_of_ours_answers_its_vm(
    fake: FakeHypervisor, backend: Backend
) -> None:
    lifecycle = RacedLifecycle(fake, racer=OWNER)
    made = ok(CreateVM(lifecycle, ownership(lifecycle))(request("raced")))
    winner = ok(lifecycle.find_by_name("raced"))
    assert winner is not None
    assert made == CreatedVM(id=winner.id)
    assert len(ok(backend.inventory.list_vms())) == 1


def test_a_create_that_loses_a_race_to_another_provider_is_already_exists(
    fake: FakeHypervisor, backend: Backend
) -> None:
    lifecycle = RacedLifecycle(fake, racer=OwnerMark(provider="other/provider"))
    error = error_of(CreateVM(lifecycle, ownership(lifecycle))(request("raced")))
    assert error.kind is ErrorKind.ALREADY_EXISTS
    assert "another provider" in error.message
    assert len(ok(backend.inventory.list_vms())) == 1


# --- Crash leftovers ---------------------------------------------------------------------------


def test_create_replaces_its_own_abandoned_leftover(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    began = clock.now() - CREATE_DEADLINE_SECONDS
    leftover = fake.add_unfinished_vm("crashed", OWNER, building_since=began)
    made = ok(create_vm(backend, clock)(request("crashed")))
    assert made.id != leftover
    assert ok(backend.lifecycle.find_by_name("crashed")) == VMRecord(
        id=made.id, name="crashed", owner=OWNER
    )
    assert len(ok(backend.inventory.list_vms())) == 1


def test_create_waits_for_another_replicas_create_of_the_same_name(
    fake: FakeHypervisor, backend: Backend
) -> None:
    in_progress = fake.add_unfinished_vm("shared", OWNER, building_since=1_800_000_000.0)

    class OtherReplicaFinishes(ManualClock):
        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            fake.finish_building(in_progress)

    made = ok(create_vm(backend, OtherReplicaFinishes())(request("shared")))
    assert made.id == in_progress
    assert len(ok(backend.inventory.list_vms())) == 1


def test_create_gives_up_on_a_create_that_never_finishes_with_a_retryable_error(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    fake.add_unfinished_vm("stuck", OWNER, building_since=clock.now())
    error = error_of(create_vm(backend, clock)(request("stuck")))
    assert error.kind is ErrorKind.UNAVAILABLE
    assert "still being created" in error.message
    waited = WAIT_FOR_OTHER_CREATE_SECONDS
    assert waited <= clock.now() - 1_800_000_000.0 <= waited + POLL_SECONDS


def test_a_same_named_vm_vanishing_while_it_is_read_is_looked_up_again(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    fake.faults.fail("find_by_name", ProviderError.vm_not_found("vm-92"), times=1)
    made = ok(create_vm(backend, clock)(request("racing")))
    assert ok(backend.lifecycle.find_by_name("racing")) == VMRecord(
        id=made.id, name="racing", owner=OWNER
    )


def test_another_providers_unfinished_vm_is_a_name_clash(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    other = OwnerMark(provider="other/provider")
    fake.add_unfinished_vm("theirs", other, building_since=0.0)
    assert error_kind(create_vm(backend, clock)(request("theirs"))) is ErrorKind.ALREADY_EXISTS
    clone = clone_vm(backend)(CloneRequest(source_vm_id=create(backend), target_name="theirs"))
    assert error_kind(clone) is ErrorKind.ALREADY_EXISTS


def test_clone_replaces_its_own_abandoned_leftover(fake: FakeHypervisor, backend: Backend) -> None:
    source = create(backend)
    leftover = fake.add_unfinished_vm("copy", OWNER, building_since=0.0)
    made = ok(clone_vm(backend)(CloneRequest(source_vm_id=source, target_name="copy")))
    assert made.id != leftover
    assert ok(backend.lifecycle.find_unfinished()) == []


def test_the_sweep_removes_only_this_providers_abandoned_leftovers(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    old = clock.now() - CREATE_DEADLINE_SECONDS - 1
    fake.add_unfinished_vm("ours-old", OWNER, building_since=old)
    young = fake.add_unfinished_vm("ours-young", OWNER, building_since=clock.now() - 10)
    theirs = fake.add_unfinished_vm("theirs-old", OwnerMark(provider="o/p"), building_since=old)
    finished = create(backend, "finished")
    report = ok(SweepLeftovers(backend.lifecycle, clock, LeftoverPolicy(owner=OWNER))())
    assert report.removed == ("ours-old",)
    assert report.failures == ()
    assert {vm.id for vm in ok(backend.inventory.list_vms())} == {young, theirs, finished}


def test_the_sweep_reports_a_leftover_it_could_not_remove(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    fake.add_unfinished_vm("stuck", OWNER, building_since=0.0)
    fake.faults.fail("delete", ProviderError.unavailable("host went away"))
    report = ok(SweepLeftovers(backend.lifecycle, clock, LeftoverPolicy(owner=OWNER))())
    assert report.removed == ()
    assert [failure.message for failure in report.failures] == ["host went away"]


class SweptStaging:
    """Staging storage that reports one sweep, and records the age it was asked for."""

    def __init__(self, swept: StagedSweep) -> None:
        self.swept = swept
        self.asked: list[float] = []

    def sweep_reachable(self, older_than_seconds: float) -> StagedSweep:
        self.asked.append(older_than_seconds)
        return self.swept


def test_the_sweep_removes_staged_temporaries_of_dead_transfers_whatever_the_backend(
    backend: Backend, clock: ManualClock
) -> None:
    place_down = ProviderError.unavailable("s3://mig/lab/*: endpoint unreachable")
    staging = SweptStaging(StagedSweep(removed=3, failures=(place_down,)))
    policy = LeftoverPolicy(owner=OWNER, transfer_abandoned_after_seconds=7200)
    report = ok(SweepLeftovers(backend.lifecycle, clock, policy, staging=staging)())
    assert staging.asked == [7200]  # twice the transfer deadline: never a live transfer's
    assert report.removed_staged == 3
    assert report.failures == (place_down,)


def test_delete_is_idempotent(backend: Backend) -> None:
    vm_id = create(backend)
    delete = DeleteVM(backend.lifecycle)
    ok(delete(vm_id))
    ok(delete(vm_id))
    ok(delete("never-existed"))


def test_delete_reports_real_failures(fake: FakeHypervisor, backend: Backend) -> None:
    vm_id = create(backend)
    fake.faults.fail("delete", ProviderError.unavailable("hypervisor gone"))
    assert error_kind(DeleteVM(backend.lifecycle)(vm_id)) is ErrorKind.UNAVAILABLE


def test_describe_of_a_missing_vm_is_none_and_addresses_are_filtered(backend: Backend) -> None:
    describe = DescribeVM(backend.inventory)
    assert ok(describe("missing")) is None
    vm_id = create(backend)
    ok(backend.power.power_on(vm_id))
    description = ok(describe(vm_id))
    assert description is not None
    assert description.ips
    assert not any(ip.startswith(("127.", "fe80", "::1")) for ip in description.ips)
    listed = ok(ListVMs(backend.inventory)())
    assert listed[0].ips == description.ips


# --- Power ------------------------------------------------------------------------------------


def test_power_on_of_a_running_vm_and_off_of_a_stopped_vm_do_nothing(
    backend: Backend, clock: ManualClock
) -> None:
    vm_id = create(backend)
    power = PowerVM(backend.power, clock)
    assert ok(power(vm_id, PowerOp.OFF, 0)) is None
    assert ok(power(vm_id, PowerOp.SHUTDOWN_GRACEFUL, 60)) is None
    assert ok(power(vm_id, PowerOp.ON, 0)) is None
    assert ok(power(vm_id, PowerOp.ON, 0)) is None
    assert ok(backend.power.power_state(vm_id)) is PowerState.ON


def test_on_off_and_reboot_finish_within_the_call_and_clear_a_recorded_deadline(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    vm_id = create(backend)
    power = PowerVM(backend.power, clock)
    # A deadline left over while the VM was off.
    ok(backend.power.request_shutdown(vm_id, int(clock.now()) + 60))
    assert ok(power(vm_id, PowerOp.ON, 0)) is None
    assert ok(backend.power.shutdown_deadline(vm_id)) is None
    assert ok(power(vm_id, PowerOp.REBOOT, 0)) is None
    fake.guest_honors_shutdown = False
    ok(backend.power.request_shutdown(vm_id, int(clock.now()) + 60))
    assert ok(power(vm_id, PowerOp.OFF, 0)) is None
    assert ok(backend.power.shutdown_deadline(vm_id)) is None
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF


def test_power_on_starts_nothing_when_the_recorded_deadline_cannot_be_cleared(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    vm_id = create(backend)
    fake.faults.fail("clear_shutdown_deadline", ProviderError.unavailable("host went away"))
    assert error_kind(PowerVM(backend.power, clock)(vm_id, PowerOp.ON, 0)) is ErrorKind.UNAVAILABLE
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF


def test_a_paused_vm_is_off_and_power_on_resumes_it(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    vm_id = create(backend)
    ok(backend.power.power_on(vm_id))
    fake.pause(vm_id)
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF
    ok(PowerVM(backend.power, clock)(vm_id, PowerOp.ON, 0))
    assert ok(backend.power.power_state(vm_id)) is PowerState.ON


def test_reboot_of_a_stopped_vm_is_a_failed_precondition(
    backend: Backend, clock: ManualClock
) -> None:
    vm_id = create(backend)
    assert error_kind(PowerVM(backend.power, clock)(vm_id, PowerOp.REBOOT, 0)) is (
        ErrorKind.FAILED_PRECONDITION
    )


def test_power_of_a_missing_vm_is_not_found(backend: Backend, clock: ManualClock) -> None:
    assert (
        error_kind(PowerVM(backend.power, clock)("missing", PowerOp.ON, 0)) is ErrorKind.NOT_FOUND
    )


def test_graceful_shutdown_completes_when_the_guest_honours_it(clock: ManualClock) -> None:
    backend = fake_backend(FakeHypervisor(clock, guest_shutdown_seconds=5))
    vm_id = create(backend)
    ok(backend.power.power_on(vm_id))
    power, status = PowerVM(backend.power, clock), TaskStatus(backend.power, backend.tasks, clock)
    task = ok(power(vm_id, PowerOp.SHUTDOWN_GRACEFUL, 60))
    assert task is not None
    assert not status(task.id).done
    clock.advance(6)
    assert status(task.id).done
    assert status(task.id).error == ""
    assert ok(backend.power.shutdown_deadline(vm_id)) is None


def test_graceful_shutdown_falls_back_to_power_off_after_the_timeout(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    fake.guest_honors_shutdown = False
    vm_id = create(backend)
    ok(backend.power.power_on(vm_id))
    power, status = PowerVM(backend.power, clock), TaskStatus(backend.power, backend.tasks, clock)
    task = ok(power(vm_id, PowerOp.SHUTDOWN_GRACEFUL, 30))
    assert task is not None
    clock.advance(10)
    repeated = ok(power(vm_id, PowerOp.SHUTDOWN_GRACEFUL, 30))
    assert repeated == task  # the manager repeats every 5 s: same task, no second request
    assert status(task.id).done is False
    assert ok(backend.power.power_state(vm_id)) is PowerState.ON
    clock.advance(21)
    state = status(task.id)
    assert state.done
    assert state.error == ""
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF


def test_a_repeated_shutdown_past_the_deadline_forces_the_power_off(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    fake.guest_honors_shutdown = False
    vm_id = create(backend)
    ok(backend.power.power_on(vm_id))
    power = PowerVM(backend.power, clock)
    ok(power(vm_id, PowerOp.SHUTDOWN_GRACEFUL, 10))
    clock.advance(11)
    assert ok(power(vm_id, PowerOp.SHUTDOWN_GRACEFUL, 10)) is None
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF


def test_an_old_shutdown_task_never_stops_a_vm_started_again(
    backend: Backend, clock: ManualClock
) -> None:
    vm_id = create(backend)
    ok(backend.power.power_on(vm_id))
    power, status = PowerVM(backend.power, clock), TaskStatus(backend.power, backend.tasks, clock)
    task = ok(power(vm_id, PowerOp.SHUTDOWN_GRACEFUL, 10))
    assert task is not None
    assert status(task.id).done  # the guest shut down at once
    ok(power(vm_id, PowerOp.ON, 0))
    clock.advance(3600)
    assert status(task.id).done
    assert ok(backend.power.power_state(vm_id)) is PowerState.ON


def test_a_stale_recorded_deadline_starts_a_fresh_shutdown(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    fake.guest_honors_shutdown = False
    vm_id = create(backend)
    ok(backend.power.power_on(vm_id))
    ok(backend.power.request_shutdown(vm_id, int(clock.now()) - STALE_SHUTDOWN_SECONDS - 1))
    task = ok(PowerVM(backend.power, clock)(vm_id, PowerOp.SHUTDOWN_GRACEFUL, 60))
    assert task is not None
    assert ShutdownTask.parse(task.id) == ShutdownTask(vm_id=vm_id, deadline=int(clock.now()) + 60)
    assert ok(backend.power.power_state(vm_id)) is PowerState.ON


def test_task_status_of_unknown_ids_is_done_with_an_error(
    backend: Backend, clock: ManualClock
) -> None:
    status = TaskStatus(backend.power, backend.tasks, clock)
    for task_id in ["garbage", "shutdown:", "shutdown:x:vm", "shutdown:²:vm"]:
        state = status(task_id)
        assert state.done
        assert task_id in state.error or "unknown task" in state.error
    assert status("").done
    assert status("shutdown:100:gone").done  # the VM no longer exists: nothing left to do


def test_task_status_while_the_hypervisor_is_down_is_still_running(
    fake: FakeHypervisor, backend: Backend, clock: ManualClock
) -> None:
    vm_id = create(backend)
    fake.faults.fail("power_state", ProviderError.unavailable("connection lost"))
    state = TaskStatus(backend.power, backend.tasks, clock)(
        ShutdownTask(vm_id=vm_id, deadline=1).task_ref().id
    )
    assert not state.done
    assert "connection lost" in state.error


# --- Reconfigure ------------------------------------------------------------------------------


def test_reconfigure_applies_growth_and_refuses_shrinking_disks(backend: Backend) -> None:
    vm_id = create(backend, disks=(DiskSpec(size_gib=10),))
    reconfigure = ReconfigureVM(backend.lifecycle, backend.inventory)
    grown = reconfigure(vm_id, VMChanges(cpu=4, memory_mib=4096, disks=(DiskSpec(size_gib=15),)))
    assert ok(grown) is None  # done within the call: no task
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib, info.disks[1].size_gib) == (4, 4096, 15)
    error = error_of(reconfigure(vm_id, VMChanges(disks=(DiskSpec(size_gib=5),))))
    assert error.kind is ErrorKind.FAILED_PRECONDITION
    assert error.message.startswith(f"{fields.desired_disk(0)} cannot shrink")
    assert for_the_manager(error) == "Disks[0] cannot shrink (15 GiB -> 5 GiB); disks only grow"
    error = error_of(reconfigure(vm_id, VMChanges(root_disk_gib=1)))
    assert "root disk" in error.message


def test_cpu_and_memory_shrink_only_while_off(backend: Backend) -> None:
    vm_id = create(backend)
    reconfigure = ReconfigureVM(backend.lifecycle, backend.inventory)
    ok(backend.power.power_on(vm_id))
    assert "CPU" in error_of(reconfigure(vm_id, VMChanges(cpu=1))).message
    assert "memory" in error_of(reconfigure(vm_id, VMChanges(memory_mib=512))).message
    ok(backend.power.power_off(vm_id))
    ok(reconfigure(vm_id, VMChanges(cpu=1, memory_mib=512)))
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (1, 512)


def test_reconfigure_of_a_missing_vm_is_not_found(backend: Backend) -> None:
    assert (
        error_kind(ReconfigureVM(backend.lifecycle, backend.inventory)("missing", VMChanges()))
        is ErrorKind.NOT_FOUND
    )


def test_hardware_upgrade_rules(backend: Backend) -> None:
    vm_id = create(backend)
    upgrade = UpgradeHardware(backend.lifecycle, backend.capabilities)
    assert ok(upgrade(vm_id, 20)) is None  # done within the call: no task
    assert error_kind(upgrade(vm_id, 15)) is ErrorKind.FAILED_PRECONDITION
    ok(backend.power.power_on(vm_id))
    assert error_kind(upgrade(vm_id, 0)) is ErrorKind.FAILED_PRECONDITION


def test_snapshot_delete_and_revert_finish_within_the_call(backend: Backend) -> None:
    vm_id = create(backend)
    snapshots = served(backend.snapshots)
    snapshot = ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="before")))
    ok(ReconfigureVM(backend.lifecycle, backend.inventory)(vm_id, VMChanges(cpu=4)))
    revert = RevertSnapshot(snapshots, backend.capabilities)
    assert ok(revert(vm_id, snapshot.id)) is None
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert info.cpu == 2
    assert ok(DeleteSnapshot(snapshots, backend.capabilities)(vm_id, snapshot.id)) is None
    assert error_kind(revert(vm_id, snapshot.id)) is ErrorKind.NOT_FOUND


# --- Capability gating ------------------------------------------------------------------------


def test_operations_the_backend_lacks_are_unsupported(
    clock: ManualClock, staging: StagingStores
) -> None:
    limited = fake_backend(
        FakeHypervisor(
            clock,
            capabilities=FAKE_CAPABILITIES.model_copy(
                update={
                    "supports_snapshots": False,
                    "supports_linked_clones": False,
                    "supports_image_import": False,
                    "supports_disk_export": False,
                    "supports_hardware_upgrade": False,
                }
            ),
        )
    )
    capabilities = limited.capabilities
    vm_id = create(limited)
    snapshot = CreateSnapshot(served(limited.snapshots), capabilities)(
        SnapshotRequest(vm_id=vm_id, name="s")
    )
    assert error_kind(snapshot) is ErrorKind.UNSUPPORTED
    clone = clone_vm(limited)
    linked = clone(CloneRequest(source_vm_id=vm_id, target_name="c", linked=True))
    assert error_kind(linked) is ErrorKind.UNSUPPORTED
    ok(clone(CloneRequest(source_vm_id=vm_id, target_name="c")))
    prepare = PrepareImage(served(limited.images), capabilities)(
        PrepareImageRequest(source=ImageSource(url="http://127.0.0.1/x"), target_name="x")
    )
    assert error_kind(prepare) is ErrorKind.UNSUPPORTED
    export = ExportDisk(
        served(limited.disk_transfer),
        capabilities,
        TransferContext(staging, LOOPBACK_GATE, SystemClock()),
    )(ExportRequest(vm_id=vm_id, destination=staged("pvc://m/x")))
    assert error_kind(export) is ErrorKind.UNSUPPORTED
    upgrade = UpgradeHardware(limited.lifecycle, capabilities)(vm_id, 0)
    assert error_kind(upgrade) is ErrorKind.UNSUPPORTED


def test_memory_snapshots_downgrade_to_disk_only_where_unsupported(clock: ManualClock) -> None:
    disk_only = fake_backend(
        FakeHypervisor(
            clock,
            capabilities=FAKE_CAPABILITIES.model_copy(update={"supports_memory_snapshots": False}),
        )
    )
    vm_id = create(disk_only)
    ok(disk_only.power.power_on(vm_id))
    snapshot = ok(
        CreateSnapshot(served(disk_only.snapshots), disk_only.capabilities)(
            SnapshotRequest(vm_id=vm_id, name="s", include_memory=True)
        )
    )
    assert not snapshot.include_memory


def claims(backend: Backend, staging: StagingStores) -> TransferClaims:
    """The backend's capabilities as the container serves them: the built staging types and
    relay claimed."""
    return TransferClaims(backend.capabilities, staging.types)


def test_export_refuses_unlisted_modes_and_compression(
    clock: ManualClock, staging: StagingStores
) -> None:
    backend = fake_backend(
        FakeHypervisor(
            clock,
            capabilities=FAKE_CAPABILITIES.model_copy(
                update={"supports_export_compression": False}
            ),
        )
    )
    vm_id = create(backend)
    export = ExportDisk(
        served(backend.disk_transfer),
        claims(backend, staging),
        TransferContext(staging, LOOPBACK_GATE, SystemClock()),
    )
    compressed = export(ExportRequest(vm_id=vm_id, destination=staged("pvc://m/x"), compress=True))
    assert error_kind(compressed) is ErrorKind.UNSUPPORTED
    relay_only = ExportDisk(
        served(backend.disk_transfer),
        FakeCapabilities(
            FakeHypervisor(
                clock,
                capabilities=claims(backend, staging)
                .capabilities()
                .model_copy(update={"supported_transfer_modes": ()}),
            )
        ),
        TransferContext(staging, LOOPBACK_GATE, SystemClock()),
    )
    unlisted = relay_only(ExportRequest(vm_id=vm_id, destination=staged("pvc://m/x")))
    assert error_kind(unlisted) is ErrorKind.UNSUPPORTED
    assert "relay" in error_of(unlisted).message


@pytest.mark.parametrize("backend_type", [PVC, S3])
def test_a_direct_transfer_through_pvc_or_s3_is_invalid_as_the_manager_says(
    backend: Backend, backend_type: StagingType, staging: StagingStores
) -> None:
    """The manager's own rule: only NFS can be reached by the hypervisor itself."""
    export = ExportDisk(
        served(backend.disk_transfer),
        claims(backend, staging),
        TransferContext(staging, LOOPBACK_GATE, SystemClock()),
    )
    direct = export(
        ExportRequest(
            vm_id="any", destination=staged("x://y/z", backend_type), mode=TransferMode.DIRECT
        )
    )
    assert error_kind(direct) is ErrorKind.INVALID_SPEC
    assert error_of(direct).field == fields.TRANSFER_MODE
    assert for_the_manager(error_of(direct)) == (
        f"transfer_mode: 'direct' cannot be used with backend_type {backend_type!r}; "
        "use 'relay' (or 'auto')"
    )
    importing = ImportDisk(
        served(backend.disk_transfer),
        IMAGE_JUDGE,
        claims(backend, staging),
        TransferContext(staging, LOOPBACK_GATE, SystemClock()),
    )
    direct_import = importing(
        ImportRequest(source=staged("x://y/z", backend_type), mode=TransferMode.DIRECT)
    )
    assert error_kind(direct_import) is ErrorKind.INVALID_SPEC


class RefusingStaging:
    """Staging that records where it was asked to write and refuses: how far a request got."""

    def __init__(self) -> None:
        self.asked: list[StagedLocation] = []

    def open_write(
        self, location: StagedLocation, size_bytes: int | None = None
    ) -> Result[StagedWriter, ProviderError]:
        self.asked.append(location)
        return Failure(ProviderError.unavailable("the test's staging refuses"))

    def open_file(self, location: StagedLocation) -> Result[StagedFile | None, ProviderError]:
        self.asked.append(location)
        return Failure(ProviderError.unavailable("the test's staging refuses"))

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        return Success(0)

    def open_read(self, location: StagedLocation) -> Result[StagedReader, ProviderError]:
        raise AssertionError("an export reads nothing staged")


def test_a_direct_transfer_through_nfs_is_carried_out_as_relay(backend: Backend) -> None:
    """The manager passes `direct` through for NFS; upstream's providers relay it."""
    staging = RefusingStaging()
    exported = transfers.export_disk(
        disk_moves(backend, staging),
        create(backend),
        "nfs://127.0.0.1/export/vmmigrations-ns-m-export.qcow2",
        backend="nfs",
        options={"server": "127.0.0.1", "export": "/export"},
        transfer_mode="direct",
    )
    assert error_of(exported).message == "the test's staging refuses"
    assert [location.key for location in staging.asked] == ["vmmigrations-ns-m-export.qcow2"]


class RecordedTransfers:
    """TransferMetrics that keep what they were told."""

    def __init__(self) -> None:
        self.bytes = 0
        self.ends: list[tuple[str, str, TransferPhase | None]] = []
        self.left: list[tuple[str, LeftBehind]] = []

    def started(self, direction: str, storage: str) -> None:
        del direction, storage

    def moved(self, direction: str, storage: str, count: int) -> None:
        self.bytes += count

    def left_behind(self, storage: str, what: LeftBehind) -> None:
        self.left.append((storage, what))

    def ended(
        self,
        direction: str,
        storage: str,
        *,
        seconds: float,
        size_bytes: int,
        failed_in: TransferPhase | None,
    ) -> None:
        self.ends.append((direction, storage, failed_in))


def test_a_transfer_is_counted_with_the_phase_a_failed_one_failed_in(
    backend: Backend, staging: StagingStores
) -> None:
    vm_id = create(backend)
    metrics = RecordedTransfers()
    disks = served(backend.disk_transfer)
    moves = transfers.DiskMoves(
        export_disk=ExportDisk(
            disks,
            claims(backend, staging),
            TransferContext(staging, LOOPBACK_GATE, SystemClock(), metrics=metrics),
        ),
        import_disk=ImportDisk(
            disks,
            IMAGE_JUDGE,
            claims(backend, staging),
            TransferContext(staging, LOOPBACK_GATE, SystemClock(), metrics=metrics),
        ),
    )
    refused = ExportDisk(
        disks,
        claims(backend, staging),
        TransferContext(RefusingStaging(), LOOPBACK_GATE, SystemClock(), metrics=metrics),
    )
    exported = ok(transfers.export_disk(moves, vm_id, "pvc://m/counted.qcow2"))
    transfers.export_disk(transfers.DiskMoves(refused, moves.import_disk), vm_id, "pvc://m/x")
    transfers.import_disk(moves, "pvc://m/counted.qcow2", expected_checksum="0" * 64)

    assert metrics.ends == [
        ("export", "pvc", None),
        ("export", "pvc", TransferPhase.OPEN),
        ("import", "pvc", TransferPhase.VERIFY),
    ]
    assert metrics.bytes == 2 * exported.estimated_size_bytes


@dataclass
class MadeWholeFirst:
    """A disk stream whose image is made whole first (as a qcow2's is), the image's first
    bytes written last; it records where it was made, and fails its making with `fails`."""

    image: bytes
    fails: ProviderError | None = None
    made_in: list[str] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    left_behind: tuple[LeftBehind, ...] = ()
    made_whole_first: bool = True

    @property
    def size_bytes(self) -> int | None:
        return len(self.image) if self.chunks else None

    def make(self, into: BinaryIO | None) -> Result[None, ProviderError]:
        self.made_in.append("scratch" if into is None else "the staged file")
        if self.fails is not None:
            return Failure(self.fails)
        if into is None:
            self.chunks = [self.image]
            return Success(None)
        into.seek(4)
        into.write(self.image[4:])
        into.seek(0)
        into.write(self.image[:4])
        return Success(None)

    def read_chunk(self) -> Result[bytes, ProviderError]:
        return Success(self.chunks.pop(0) if self.chunks else b"")

    def close(self) -> None:
        return


@dataclass
class ReadsAs:
    """DiskReading that reads every disk as `stream`."""

    stream: MadeWholeFirst

    def read_disk(
        self, disk: DiskRead, watch: TransferWatch
    ) -> Result[MadeWholeFirst, ProviderError]:
        del disk, watch
        return Success(self.stream)


class KeepsNoLocalFiles:
    """The tests' PVC store as one that keeps no local files (S3, NFS) is seen."""

    def __init__(self, staging: StagingStores) -> None:
        self._staging = staging

    def __getattr__(self, name: str) -> object:
        return getattr(self._staging, name)

    def open_file(self, location: StagedLocation) -> Result[StagedFile | None, ProviderError]:
        del location
        return Success(None)


IMAGE = b"QFI\xfb" + bytes(range(256)) * 64


@pytest.mark.parametrize(
    ("local_files", "made_in"), [(True, "the staged file"), (False, "scratch")]
)
def test_an_image_made_whole_first_is_made_in_the_staged_file_where_the_store_keeps_one(
    backend: Backend, staging: StagingStores, tmp_path: Path, local_files: bool, made_in: str
) -> None:
    stream, metrics = MadeWholeFirst(IMAGE), RecordedTransfers()
    # KeepsNoLocalFiles hands every other call on to the stores it wraps.
    store = staging if local_files else KeepsNoLocalFiles(staging)
    export = ExportDisk(
        ReadsAs(stream),
        claims(backend, staging),
        TransferContext(store, LOOPBACK_GATE, SystemClock(), metrics=metrics),  # type: ignore[arg-type]
    )
    exported = ok(transfers.export_request("any", "pvc://m/made.qcow2").bind(export))
    assert stream.made_in == [made_in]
    assert exported.checksum == hashlib.sha256(IMAGE).hexdigest()
    assert (tmp_path / "m" / "made.qcow2").read_bytes() == IMAGE
    assert metrics.bytes == len(IMAGE)
    assert metrics.ends == [("export", "pvc", None)]


def test_an_image_whose_making_fails_in_the_staged_file_leaves_nothing_there(
    backend: Backend, staging: StagingStores, tmp_path: Path
) -> None:
    stream = MadeWholeFirst(IMAGE, fails=ProviderError.unavailable("the lease was lost"))
    metrics = RecordedTransfers()
    export = ExportDisk(
        ReadsAs(stream),
        claims(backend, staging),
        TransferContext(staging, LOOPBACK_GATE, SystemClock(), metrics=metrics),
    )
    failed = transfers.export_request("any", "pvc://m/made.qcow2").bind(export)
    assert error_of(failed).message == "the lease was lost"
    assert stream.made_in == ["the staged file"]
    assert list((tmp_path / "m").iterdir()) == []  # no temporary, no object
    assert metrics.ends == [("export", "pvc", TransferPhase.WRITE)]


def test_an_export_of_one_disk_of_several_says_what_it_leaves_behind(
    backend: Backend, staging: StagingStores, caplog: pytest.LogCaptureFixture
) -> None:
    vm_id = create(backend, "two-disks", disks=(DiskSpec(size_gib=1),))
    metrics = RecordedTransfers()
    disks = served(backend.disk_transfer)
    moves = transfers.DiskMoves(
        export_disk=ExportDisk(
            disks,
            claims(backend, staging),
            TransferContext(staging, LOOPBACK_GATE, SystemClock(), metrics=metrics),
        ),
        import_disk=ImportDisk(
            disks,
            IMAGE_JUDGE,
            claims(backend, staging),
            TransferContext(staging, LOOPBACK_GATE, SystemClock()),
        ),
    )
    ok(transfers.export_disk(moves, vm_id, "pvc://m/two.qcow2"))
    assert metrics.left == [("pvc", LeftBehind.OTHER_DISKS)]
    assert "will not have its other_disks" in caplog.text


def test_verify_checksum_without_an_expected_one_imports_and_answers_the_checksum(
    backend: Backend, staging: StagingStores
) -> None:
    """What the manager sends after an upstream export that returned no checksum."""
    moves = disk_moves(backend, staging)
    exported = ok(transfers.export_disk(moves, create(backend), "pvc://m/export.qcow2"))
    imported = transfers.import_disk(
        moves, "pvc://m/export.qcow2", target_name="unchecked", verify_checksum=True
    )
    assert ok(imported).checksum == exported.checksum


@pytest.mark.parametrize(
    ("staged", "target_name", "details"),
    [
        ("x.qcow2", "..", "target_name: '..' must be letters, digits, '.', '_' or '-', "),
        ("x.qcow2", "a/b.qcow2", "target_name: 'a/b.qcow2' must be letters, digits, "),
        ("x.qcow2", "50%", "target_name: '50%' must be letters, digits, '.', '_' or '-', "),
        ("-x.qcow2", "", "target_name: '-x' must be letters, digits, '.', '_' or '-', "),
    ],
)
def test_the_imported_disks_name_is_checked_once_by_the_import(
    backend: Backend, staging: StagingStores, staged: str, target_name: str, details: str
) -> None:
    """Given or taken from the staged object, one check (no backend checks it again), its
    message as the wire's parser used to give it; a derived name says where it came from."""
    moves = disk_moves(backend, staging)
    ok(transfers.export_disk(moves, create(backend), f"pvc://m/{staged}"))
    refused = transfers.import_disk(moves, f"pvc://m/{staged}", target_name=target_name)
    assert error_kind(refused) is ErrorKind.INVALID_SPEC
    message = for_the_manager(error_of(refused))
    assert message.startswith(details)
    assert message.endswith("(it names the imported disk)") == (not target_name)


def test_a_relay_export_as_the_manager_sends_it_works(
    backend: Backend, staging: StagingStores
) -> None:
    vm_id = create(backend)
    exported = transfers.export_disk(disk_moves(backend, staging), vm_id, "pvc://m/x.qcow2")
    assert ok(exported).export_id


def test_clone_is_idempotent_by_target_name(fake: FakeHypervisor, backend: Backend) -> None:
    source = create(backend)
    clone = clone_vm(backend)
    first = ok(clone(CloneRequest(source_vm_id=source, target_name="copy")))
    assert ok(clone(CloneRequest(source_vm_id=source, target_name="copy"))) == first
    fake.add_foreign_vm("theirs")
    taken = clone(CloneRequest(source_vm_id=source, target_name="theirs"))
    assert error_kind(taken) is ErrorKind.ALREADY_EXISTS


def test_a_migration_on_the_fake_agrees_on_checksums_and_retries_answer_the_same(
    backend: Backend, staging: StagingStores
) -> None:
    """The manager's sequence through the wire parsers and the use cases, on the fake."""
    vm_id = create(backend)
    use_cases = disk_moves(backend, staging)
    url = "pvc://m/vmmigrations/ns/m/export.qcow2"

    def export(vm: str, disk_format: str = "qcow2") -> Result[ExportResult, ProviderError]:
        return transfers.export_disk(use_cases, vm, url, disk_format=disk_format)

    def import_(name: str, checksum: str) -> Result[ImportResult, ProviderError]:
        return transfers.import_disk(use_cases, url, target_name=name, expected_checksum=checksum)

    exported = ok(export(vm_id))
    assert ok(export(vm_id)) == exported  # its first answer was lost
    imported = ok(import_("web-migrated", exported.checksum))
    assert imported.checksum == exported.checksum
    assert ok(import_("web-migrated", exported.checksum)) == imported
    assert error_kind(import_("other", "0" * 64)) is ErrorKind.FAILED_PRECONDITION
    ok(export(create(backend, "vm-2"), "raw"))
    assert error_kind(import_("web-migrated", "")) is ErrorKind.ALREADY_EXISTS
