"""vSphere Tasks as task ids: any replica answers TaskStatus from vCenter alone, at once."""

from __future__ import annotations

from typing import Any

import pytest
from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.adapters.hypervisors.vsphere.tasks import (
    TASK_DEADLINE_SECONDS,
    VSphereTask,
    VSphereTaskTracker,
    wait,
)
from pyrigaud.application.backend import Backend
from pyrigaud.application.use_cases.power_vm import PowerVM
from pyrigaud.application.use_cases.reconfigure_vm import ReconfigureVM, UpgradeHardware
from pyrigaud.application.use_cases.snapshots import DeleteSnapshot, RevertSnapshot
from pyrigaud.application.use_cases.task_status import TaskStatus
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import (
    CreateRequest,
    OwnerMark,
    SnapshotRequest,
    VMChanges,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import PowerOp, PowerState
from pyrigaud.domain.tasks import ShutdownTask, TaskRef, TaskState

from contract.harness import made
from support import ManualClock, error_kind, error_of, ok, present
from support.vsphere import TEMPLATE_VM, Simulator, running_simulator, vm_ref

OWNER = OwnerMark(provider="tests/vsphere-tasks")
vim: Any = untyped_vim  # pyVmomi's data-object constructors are untyped


def create(backend: Backend, name: str) -> str:
    request = CreateRequest(
        name=name, vm_class=VMClass(cpu=1, memory_mib=256), image=VMImage(template_name=TEMPLATE_VM)
    )
    return made(backend.tasks, backend.lifecycle.start_create(request, OWNER))


def issued(result: Any) -> TaskRef:
    task = ok(result)
    assert isinstance(task, TaskRef)
    assert task.id.startswith("vsphere-task:task-")
    return task


def test_task_ids_round_trip_and_other_ids_are_not_vsphere_tasks() -> None:
    task = VSphereTask(task="task-42", vm_id="vm:with:colons")
    assert VSphereTask.parse(task.task_ref().id) == task
    for other in (
        "",
        "vsphere-task:",
        "vsphere-task:task-1:",
        "vsphere-task::vm-1",
        "vsphere-task:../x:vm-1",
        "shutdown:1900000000:vm-1",
        "task-42",
    ):
        assert VSphereTask.parse(other) is None


def test_a_reconfigure_task_is_done_for_any_replica_and_its_change_is_visible(
    backend: Backend, simulator: Simulator
) -> None:
    vm_id = create(backend, "vs-task-reconf")
    task = issued(backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=3, memory_mib=1024)))
    other_replica = simulator.backend()
    assert other_replica.tasks.task_state(task.id) == TaskState.succeeded()
    info = ok(other_replica.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (3, 1024)
    status = TaskStatus(power=other_replica.power, tracker=other_replica.tasks, clock=ManualClock())
    assert status(task.id) == TaskState.succeeded()
    assert backend.tasks.task_state("shutdown:1900000000:vm-1") is None  # not a vSphere task


def test_power_upgrade_and_snapshot_tasks_report_done(backend: Backend) -> None:
    vm_id = create(backend, "vs-task-power")
    upgrade = issued(backend.lifecycle.upgrade_hardware(vm_id, 0))
    assert backend.tasks.task_state(upgrade.id) == TaskState.succeeded()
    snapshot = ok(
        present(backend.snapshots).create_snapshot(SnapshotRequest(vm_id=vm_id, name="base"))
    )
    on = issued(backend.power.power_on(vm_id))
    assert backend.tasks.task_state(on.id) == TaskState.succeeded()
    assert ok(backend.power.power_on(vm_id)) is None  # already on: nothing to do
    # Reading task.info whole fails after a revert or removal on the simulator; state does not.
    revert = issued(present(backend.snapshots).revert_snapshot(vm_id, snapshot.id))
    assert backend.tasks.task_state(revert.id) == TaskState.succeeded()
    removal = issued(present(backend.snapshots).delete_snapshot(vm_id, snapshot.id))
    assert backend.tasks.task_state(removal.id) == TaskState.succeeded()
    off = issued(backend.power.power_off(vm_id))
    assert backend.tasks.task_state(off.id) == TaskState.succeeded()
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF
    assert ok(backend.power.power_off(vm_id)) is None  # already off: nothing to do


def test_a_reboot_without_guest_tools_is_the_reset_task(backend: Backend) -> None:
    vm_id = create(backend, "vs-task-reboot")
    ok(backend.power.power_on(vm_id))
    reset = issued(backend.power.reboot(vm_id))  # the simulator has no RebootGuest: the reset path
    assert backend.tasks.task_state(reset.id) == TaskState.succeeded()
    assert ok(backend.power.power_state(vm_id)) is PowerState.ON


def test_the_power_use_case_hands_back_vsphere_tasks_and_keeps_its_rules(
    backend: Backend, simulator: Simulator
) -> None:
    vm_id = create(backend, "vs-task-usecase-power")
    clock = ManualClock()
    power = PowerVM(backend.power, clock)
    ok(backend.power.request_shutdown(vm_id, 1_900_000_000))  # left over from an earlier shutdown
    on = issued(power(vm_id, PowerOp.ON, 0))
    assert ok(backend.power.shutdown_deadline(vm_id)) is None  # cleared before the task was issued
    assert ok(power(vm_id, PowerOp.ON, 0)) is None  # already on: no task
    reboot = issued(power(vm_id, PowerOp.REBOOT, 0))
    off = issued(power(vm_id, PowerOp.OFF, 0))
    assert ok(power(vm_id, PowerOp.OFF, 0)) is None
    assert error_kind(power(vm_id, PowerOp.REBOOT, 0)) is ErrorKind.FAILED_PRECONDITION
    other_replica = simulator.backend()
    status = TaskStatus(power=other_replica.power, tracker=other_replica.tasks, clock=clock)
    assert [status(task.id) for task in (on, reboot, off)] == [TaskState.succeeded()] * 3
    described = ok(other_replica.inventory.describe(vm_id))
    assert described is not None
    assert described.power_state is PowerState.OFF


def test_a_shutdown_past_its_deadline_is_done_once_the_forced_power_off_task_is(
    backend: Backend, simulator: Simulator
) -> None:
    """The guest ignored the request (recorded while off, so no ShutdownGuest reached it)."""
    vm_id = create(backend, "vs-task-forced-off")
    clock = ManualClock()
    deadline = int(clock.now()) + 60
    ok(backend.power.request_shutdown(vm_id, deadline))
    ok(backend.power.power_on(vm_id))
    other_replica = simulator.backend()
    status = TaskStatus(power=other_replica.power, tracker=other_replica.tasks, clock=clock)
    shutdown = ShutdownTask(vm_id=vm_id, deadline=deadline).task_ref().id
    assert status(shutdown) == TaskState.running()
    clock.advance(61)
    assert status(shutdown) == TaskState.succeeded()
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF
    assert ok(backend.power.shutdown_deadline(vm_id)) is None


def test_reconfigure_upgrade_and_snapshot_use_cases_hand_back_vsphere_tasks(
    backend: Backend, simulator: Simulator
) -> None:
    vm_id = create(backend, "vs-task-usecase-reconf")
    snapshots = backend.snapshots
    assert snapshots is not None
    reconfigure = ReconfigureVM(lifecycle=backend.lifecycle, inventory=backend.inventory)
    assert ok(reconfigure(vm_id, VMChanges(cpu=1, memory_mib=256))) is None  # nothing differs
    grown = issued(reconfigure(vm_id, VMChanges(cpu=2, memory_mib=512)))
    upgrade = issued(
        UpgradeHardware(lifecycle=backend.lifecycle, capabilities=backend.capabilities)(vm_id, 0)
    )
    snapshot = ok(
        present(backend.snapshots).create_snapshot(SnapshotRequest(vm_id=vm_id, name="small"))
    )
    issued(reconfigure(vm_id, VMChanges(cpu=4)))
    revert = issued(RevertSnapshot(snapshots, backend.capabilities)(vm_id, snapshot.id))
    removal = issued(DeleteSnapshot(snapshots, backend.capabilities)(vm_id, snapshot.id))
    other_replica = simulator.backend()
    status = TaskStatus(power=other_replica.power, tracker=other_replica.tasks, clock=ManualClock())
    assert [status(task.id) for task in (grown, upgrade, revert, removal)] == [
        TaskState.succeeded()
    ] * 4
    info = ok(other_replica.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (2, 512)  # the snapshot's, restored by the revert
    assert (
        error_kind(RevertSnapshot(snapshots, backend.capabilities)(vm_id, snapshot.id))
        is ErrorKind.NOT_FOUND
    )


def test_a_failed_task_is_done_with_its_fault(backend: Backend, simulator: Simulator) -> None:
    vm_id = create(backend, "vs-task-fails")
    session = simulator.session()
    try:  # powering off a VM that is off: the Task ends in error (InvalidPowerState)
        task = session.call(lambda instance: vm_ref(instance, vm_id).PowerOffVM_Task())
    finally:
        session.close()
    state = backend.tasks.task_state(VSphereTask(task=task._moId, vm_id=vm_id).task_ref().id)
    assert state is not None
    assert state.done
    assert state.error.startswith("failed_precondition: vSphere task failed")


def test_a_running_task_is_not_done_and_an_unknown_one_is_done_with_an_error() -> None:
    with running_simulator("-held-task") as held:
        backend = held.backend()
        assert held.held_task.startswith("task-")
        running = VSphereTask(task=held.held_task, vm_id="vm-1").task_ref().id
        assert backend.tasks.task_state(running) == TaskState.running()
        gone = backend.tasks.task_state(VSphereTask(task="task-999999", vm_id="vm-1").task_ref().id)
        assert gone is not None
        assert gone.done
        assert "'task-999999'" in gone.error
        assert "unknown or expired" in gone.error


def test_a_wait_on_a_task_polls_by_the_sessions_clock_and_gives_up_at_its_deadline() -> None:
    """The held task never finishes: a manual clock moves through the whole deadline with no
    real sleep, and the wait ends as UNAVAILABLE rather than hanging."""
    clock = ManualClock()
    with running_simulator("-held-task") as held:
        session = VSphereSession(
            held.endpoint, lambda: (held.username, held.password), insecure=True, clock=clock
        )
        started = clock.now()
        waited = session.call(
            lambda instance: wait(instance, vim.Task(held.held_task, instance._stub))
        )
        session.close()
    assert error_of(waited) == ProviderError.unavailable("vSphere task did not finish in time")
    assert clock.now() - started > TASK_DEADLINE_SECONDS


def test_an_unreachable_vcenter_leaves_the_task_running_with_the_reason() -> None:
    closed = VSphereTaskTracker(
        VSphereSession("https://127.0.0.1:1/sdk", lambda: ("u", "p"), True, clock=ManualClock())
    )
    state = closed.task_state(VSphereTask(task="task-1", vm_id="vm-1").task_ref().id)
    assert state is not None
    assert not state.done
    assert state.error.startswith("unavailable:")


@pytest.mark.parametrize("vm_id", ["vm-999999", "../x"])
def test_tasks_for_missing_vms_are_not_found(backend: Backend, vm_id: str) -> None:
    assert error_kind(backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=2))) is ErrorKind.NOT_FOUND
    assert error_kind(backend.power.power_on(vm_id)) is ErrorKind.NOT_FOUND
