"""Create and Clone return at once with the clone task; the VM is named by the instanceUuid
chosen for it, and its MoRef (what vCenter assigns once the clone is done) works as well."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from returns.result import Result

from pyrigaud.adapters.hypervisors.vsphere.tasks import VSphereTask
from pyrigaud.adapters.hypervisors.vsphere.vcenter import INSTANCE_UUID
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import TaskTracker
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    DiskDefaults,
    DiskSpec,
    NetworkAttachment,
    OwnerMark,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef, TaskState

from contract.harness import made, settle
from support import error_kind, ok, present
from support.vsphere import TEMPLATE_VM, Simulator, create_use_case, running_simulator

OWNER = OwnerMark(provider="tests/vsphere-create-tasks")
HELD_CLONE_MILLISECONDS = 1500


def request(name: str, **changes: object) -> CreateRequest:
    base = CreateRequest(
        name=name,
        vm_class=VMClass(cpu=2, memory_mib=512, disk_defaults=DiskDefaults(size_gib=20)),
        image=VMImage(template_name=TEMPLATE_VM),
        disks=(DiskSpec(size_gib=3),),
        networks=(NetworkAttachment(portgroup="DC0_DVPG0"),),
        user_data=b"#cloud-config\n",
    )
    return base.model_copy(update=changes)


def test_create_returns_the_clone_task_and_the_instance_uuid_at_once(
    simulator: Simulator, backend: Backend
) -> None:
    created = ok(backend.lifecycle.start_create(request("vs-task-create"), OWNER))
    assert INSTANCE_UUID.fullmatch(created.id)
    assert created.task is not None
    task = VSphereTask.parse(created.task.id)
    assert task is not None
    assert task.vm_id == created.id
    # Any replica (here: a fresh backend, as after a restart) answers the task and finds the VM.
    other_replica = simulator.backend()
    assert settle(other_replica.tasks, created.task) == TaskState.succeeded()
    info = ok(other_replica.inventory.vm_info(created.id))
    assert info is not None
    assert (info.id, info.name, info.cpu, info.memory_mib) == (created.id, "vs-task-create", 2, 512)
    assert [disk.size_gib for disk in info.disks] == [20, 3]
    assert len(info.networks) == 1  # the template's NIC replaced by the one asked for
    assert info.networks[0].name.startswith("DVSwitch:")
    assert ok(other_replica.power.power_state(created.id)) is PowerState.OFF


def test_clone_returns_its_task_and_the_instance_uuid(backend: Backend) -> None:
    source = made(backend.tasks, backend.lifecycle.start_create(request("vs-task-src"), OWNER))
    cloned = ok(
        present(backend.cloning).start_clone(
            CloneRequest(source_vm_id=source, target_name="vs-task-copy"), OWNER
        )
    )
    assert INSTANCE_UUID.fullmatch(cloned.id)
    assert cloned.id != source
    assert cloned.task is not None
    assert settle(backend.tasks, cloned.task) == TaskState.succeeded()
    info = ok(backend.inventory.vm_info(cloned.id))
    assert info is not None
    assert info.name == "vs-task-copy"


def test_a_vm_answers_to_its_instance_uuid_and_to_its_moref(backend: Backend) -> None:
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request("vs-two-ids"), OWNER))
    described = ok(backend.inventory.describe(vm_id))
    assert described is not None
    moref = described.raw["moref"]
    assert moref.startswith("vm-")
    for on, off in ((vm_id, moref), (moref, vm_id)):
        settled_power(backend.tasks, backend.power.power_on(on))
        assert [ok(backend.power.power_state(i)) for i in (vm_id, moref)] == [PowerState.ON] * 2
        settled_power(backend.tasks, backend.power.power_off(off))
        by_moref = ok(backend.inventory.describe(moref))
        assert by_moref is not None
        assert by_moref.power_state is PowerState.OFF
    ok(backend.lifecycle.delete(moref))
    assert ok(backend.inventory.describe(vm_id)) is None
    assert ok(backend.inventory.describe(moref)) is None


def test_a_clone_task_that_fails_is_done_with_its_fault_and_leaves_no_vm() -> None:
    """Two Creates of one name that both found it free (the launcher holds each clone, so both
    look before either clone exists): vCenter fails the second clone with DuplicateName."""
    delay = f"CloneVM_Task={HELD_CLONE_MILLISECONDS}"
    with running_simulator("-method-delay", delay) as simulator:
        replicas = [simulator.backend(), simulator.backend()]
        with ThreadPoolExecutor(len(replicas)) as pool:
            started = list(
                pool.map(
                    lambda replica: ok(replica.lifecycle.start_create(request("vs-twice"), OWNER)),
                    replicas,
                )
            )
        outcomes = [
            (vm, settle(replica.tasks, task_of(vm)))
            for replica, vm in zip(replicas, started, strict=True)
        ]
        failed = [(vm, state) for vm, state in outcomes if state.error]
        succeeded = [vm for vm, state in outcomes if not state.error]
        assert len(failed) == len(succeeded) == 1, outcomes
        (loser, state), (winner,) = failed[0], succeeded
        assert state.done
        assert state.error.startswith("already_exists")
        watcher = simulator.backend()
        assert ok(watcher.inventory.describe(loser.id)) is None
        assert [vm.id for vm in ok(watcher.inventory.list_vms()) if vm.name == "vs-twice"] == [
            winner.id
        ]
        # The manager's next Create of the name learns the winner's id: the backend reports
        # the name in use, and the ownership rule returns the VM as ours.
        again = watcher.lifecycle.start_create(request("vs-twice"), OWNER)
        assert error_kind(again) is ErrorKind.ALREADY_EXISTS
        created = create_use_case(watcher, OWNER)(request("vs-twice"))
        assert ok(created) == CreatedVM(id=winner.id)


def task_of(vm: CreatedVM) -> TaskRef:
    assert vm.task is not None
    return vm.task


def settled_power(tracker: TaskTracker, result: Result[TaskRef | None, ProviderError]) -> None:
    task = ok(result)
    if task is not None:
        assert settle(tracker, task) == TaskState.succeeded()
