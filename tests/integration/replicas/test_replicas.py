"""The provider is stateless: whatever one replica did, the other can see, continue and finish."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.replica import NAME_PREFIX, Pair, listed_vms

CLASS_JSON = '{"CPU":1,"MemoryMiB":256}'
GRACEFUL_SECONDS = 3  # the task's deadline, past which a replica forces the power-off
SETTLE_SECONDS = 60
# A replica learns of another's change from the hypervisor's events or update feed: on the
# simulator within about a second (a bench figure); this only bounds the wait.
OTHER_REPLICA_SEES_SECONDS = 30


def create(stub: pb_grpc.ProviderStub, pair: Pair, name: str) -> str:
    request = pb.CreateRequest(
        name=NAME_PREFIX + name, class_json=CLASS_JSON, image_json=pair.image_json
    )
    created = stub.Create(request, timeout=90)
    settle(stub, created.task)
    return created.id


def create_as_the_manager_does(stub: pb_grpc.ProviderStub, pair: Pair, name: str) -> str:
    """Create, and Create again once if its task failed: a Create that lost a race on the
    hypervisor (vCenter fails the second clone of a name) learns the winner's id that way."""
    request = pb.CreateRequest(
        name=NAME_PREFIX + name, class_json=CLASS_JSON, image_json=pair.image_json
    )
    created = stub.Create(request, timeout=90)
    if outcome(stub, created.task):
        created = stub.Create(request, timeout=90)
        settle(stub, created.task)
    return created.id


def settle(stub: pb_grpc.ProviderStub, task: pb.TaskRef) -> None:
    """Poll a task (if any) until done, bounded; a task that ends in an error fails the test."""
    error = outcome(stub, task)
    assert not error, f"task {task.id} failed: {error}"


def outcome(stub: pb_grpc.ProviderStub, task: pb.TaskRef) -> str:
    """Poll a task (if any) until done, bounded: its error, "" when it succeeded."""
    if not task.id:
        return ""
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        status = stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=30)
        if status.done:
            return status.error
        time.sleep(0.2)
    raise AssertionError(f"task {task.id} not done in {SETTLE_SECONDS} s")


def power(stub: pb_grpc.ProviderStub, vm_id: str, op: pb.PowerOp.ValueType) -> None:
    settle(stub, stub.Power(pb.PowerRequest(id=vm_id, op=op), timeout=60).task)


def power_state(stub: pb_grpc.ProviderStub, vm_id: str) -> str:
    described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=30)
    assert described.exists
    return described.power_state


def seen_by_the_other(stub: pb_grpc.ProviderStub, vm_id: str, state: str | None) -> bool:
    """Whether this replica comes to describe the VM in `state` (None: gone), bounded: it shows
    what another replica did once its events or update feed have told it."""
    deadline = time.monotonic() + OTHER_REPLICA_SEES_SECONDS
    while True:
        described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=30)
        seen = described.power_state if described.exists else None
        if seen == state or time.monotonic() > deadline:
            return seen == state
        time.sleep(0.1)


def test_a_vm_made_through_one_replica_is_run_and_deleted_through_the_other(pair: Pair) -> None:
    vm_id = create(pair.a.stub, pair, "handover")
    assert power_state(pair.b.stub, vm_id) == "Off"
    power(pair.b.stub, vm_id, pb.POWER_OP_ON)
    assert power_state(pair.b.stub, vm_id) == "On"  # the replica that did it: at once
    assert seen_by_the_other(pair.a.stub, vm_id, "On")
    power(pair.b.stub, vm_id, pb.POWER_OP_OFF)
    assert power_state(pair.b.stub, vm_id) == "Off"
    assert seen_by_the_other(pair.a.stub, vm_id, "Off")
    settle(pair.b.stub, pair.b.stub.Delete(pb.DeleteRequest(id=vm_id), timeout=60).task)
    assert not pair.b.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=30).exists
    assert seen_by_the_other(pair.a.stub, vm_id, None)


def test_a_graceful_shutdown_task_from_one_replica_is_finished_by_the_other(pair: Pair) -> None:
    vm_id = create(pair.a.stub, pair, "graceful")
    power(pair.a.stub, vm_id, pb.POWER_OP_ON)
    request = pb.PowerRequest(
        id=vm_id, op=pb.POWER_OP_SHUTDOWN_GRACEFUL, graceful_timeout_seconds=GRACEFUL_SECONDS
    )
    task = pair.a.stub.Power(request, timeout=60).task
    assert task.id, "a graceful shutdown is a task whatever the guest does"
    first = pair.b.stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=30)
    assert first.error == ""
    if pair.guest_obeys_shutdown:
        assert first.done  # the simulated guest went off before B was asked
    # A guest that ignores ACPI (no OS on QEMU) goes off only once B, asked after the task's
    # deadline, forces the power-off: B answers the task done, without an error.
    settle(pair.b.stub, task)
    assert power_state(pair.b.stub, vm_id) == "Off"
    assert seen_by_the_other(pair.a.stub, vm_id, "Off")


def test_concurrent_creates_of_one_name_through_both_replicas_make_one_vm(pair: Pair) -> None:
    callers = [pair.a.stub] * 4 + [pair.b.stub] * 4
    barrier = threading.Barrier(len(callers), timeout=30)

    def create_after_barrier(stub: pb_grpc.ProviderStub) -> str:
        barrier.wait()
        try:
            return create_as_the_manager_does(stub, pair, "racing")
        except grpc.RpcError as error:
            return f"{error.code().name}: {error.details()}"

    with ThreadPoolExecutor(len(callers)) as pool:
        answers = list(pool.map(create_after_barrier, callers))
    assert len(set(answers)) == 1, answers
    # A lists the VM once its update feed has told it, if B's Create was the one that won.
    deadline = time.monotonic() + OTHER_REPLICA_SEES_SECONDS
    while True:
        listed = listed_vms(pair.a.stub)
        same_name = [vm.id for vm in listed if vm.name == NAME_PREFIX + "racing"]
        if same_name or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(same_name) == 1, (same_name, answers)
    assert answers == same_name * len(callers)


def test_a_restarted_replica_loses_nothing(pair: Pair) -> None:
    vm_id = create(pair.a.stub, pair, "survivor")
    assert pair.a.restart() == 0
    assert power_state(pair.a.stub, vm_id) == "Off"
    assert create(pair.a.stub, pair, "survivor") == vm_id
    assert create(pair.b.stub, pair, "survivor") == vm_id


def test_a_reconfigure_task_from_one_replica_is_answered_by_the_other(pair: Pair) -> None:
    vm_id = create(pair.a.stub, pair, "reconfigured")
    desired = json.dumps({"Class": {"CPU": 2, "MemoryMiB": 512}})
    request = pb.ReconfigureRequest(id=vm_id, desired_json=desired)
    task = pair.a.stub.Reconfigure(request, timeout=60).task
    if pair.backend == "vsphere":
        assert task.id.startswith("vsphere-task:")  # vCenter's own Task: B looks it up there
    else:
        assert not task.id  # libvirt finishes within the call
    settle(pair.b.stub, task)
    listed = next(vm for vm in listed_vms(pair.b.stub) if vm.id == vm_id)
    assert (listed.cpu, listed.memory_mib) == (2, 512)
