"""Every RPC over real gRPC on loopback: answers, status codes, idempotency, concurrency."""

from __future__ import annotations

import contextlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from pyrigaud.domain.errors import ProviderError
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.e2e import CLASS_JSON, RunningProvider, create_vm, start_provider


def code_of(call: object, *args: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call(*args, timeout=5)  # type: ignore[operator]
    return raised.value.code()


def test_validate_answers_ok_and_reports_an_outage_as_a_value(provider: RunningProvider) -> None:
    assert provider.stub.Validate(pb.ValidateRequest(), timeout=5).ok
    provider.fake.faults.fail("check", ProviderError.unavailable("connection refused"))
    answer = provider.stub.Validate(pb.ValidateRequest(), timeout=5)
    assert not answer.ok
    assert "connection refused" in answer.message


def test_create_describe_power_delete_round_trip(provider: RunningProvider) -> None:
    stub = provider.stub
    vm_id = create_vm(stub, "e2e-vm", user_data=b"#cloud-config\n", tags=["team-a"])
    assert vm_id
    described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=5)
    assert described.exists
    assert described.power_state == "Off"
    raw = json.loads(described.provider_raw_json)
    assert all(isinstance(value, str) for value in raw.values())
    on = stub.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_ON), timeout=5)
    assert not on.HasField("task")
    described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=5)
    assert described.power_state == "On"
    assert described.ips
    assert described.console_url.startswith("vnc://127.0.0.1:")
    stub.Delete(pb.DeleteRequest(id=vm_id), timeout=5)
    assert not stub.Describe(pb.DescribeRequest(id=vm_id), timeout=5).exists
    stub.Delete(pb.DeleteRequest(id=vm_id), timeout=5)  # idempotent


def test_create_is_idempotent_and_clashes_are_already_exists(provider: RunningProvider) -> None:
    first = create_vm(provider.stub, "e2e-same")
    assert create_vm(provider.stub, "e2e-same") == first
    provider.fake.add_foreign_vm("e2e-foreign")
    request = pb.CreateRequest(name="e2e-foreign", class_json=CLASS_JSON)
    assert code_of(provider.stub.Create, request) is grpc.StatusCode.ALREADY_EXISTS


def test_concurrent_creates_of_one_name_make_one_vm(provider: RunningProvider) -> None:
    provider.fake.faults.slow("create", 0.05)
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: create_vm(provider.stub, "e2e-race"), range(8)))
    assert len(ids) == 1
    listed = provider.stub.ListVMs(pb.ListVMsRequest(), timeout=5).vms
    assert [vm.name for vm in listed].count("e2e-race") == 1


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.CreateRequest(name="", class_json=CLASS_JSON), "name"),
        (pb.CreateRequest(name="ok", class_json='{"CPU": 0, "MemoryMiB": 1}'), "class_json.CPU"),
        (pb.CreateRequest(name="ok", class_json=CLASS_JSON, disks_json="{"), "disks_json"),
    ],
)
def test_bad_create_input_is_invalid_argument_naming_the_field(
    provider: RunningProvider, request_: pb.CreateRequest, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        provider.stub.Create(request_, timeout=5)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (raised.value.details() or "").startswith(field)


@pytest.mark.parametrize(
    ("call", "request_", "details"),
    [
        (
            "Create",
            pb.CreateRequest(name="ok", class_json=CLASS_JSON, image_json='{"Path": "/nowhere"}'),
            "image_json.Path: '/nowhere' does not exist on this hypervisor",
        ),
        (
            "Create",
            pb.CreateRequest(name="ok", class_json=CLASS_JSON, image_json='{"URL": "ftp://x/y"}'),
            "image_json.URL: must be an http(s) URL",
        ),
        (
            "Create",
            pb.CreateRequest(
                name="ok",
                class_json='{"CPU": 1, "MemoryMiB": 256, "SecurityProfile": {"SecureBoot": true}}',
            ),
            "class_json.SecurityProfile.SecureBoot: needs firmware UEFI",
        ),
        (
            "ImagePrepare",
            pb.ImagePrepareRequest(image_json='{"source": {"libvirt": {"path": "/nowhere"}}}'),
            "image_json.path: '/nowhere' does not exist on this hypervisor",
        ),
        (
            "ImagePrepare",
            pb.ImagePrepareRequest(image_json='{"source": {"http": {"url": "ftp://x/y"}}}'),
            "image_json.url: must be an http(s) URL",
        ),
    ],
)
def test_a_field_the_backend_refuses_is_named_as_the_manager_sent_it(
    provider: RunningProvider, call: str, request_: object, details: str
) -> None:
    """The backend names the domain's path (image.url, source.url); the wire, each RPC's name."""
    with pytest.raises(grpc.RpcError) as raised:
        getattr(provider.stub, call)(request_, timeout=5)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == details


@pytest.mark.parametrize("vm_id", ["", "missing", "vm-42", "../..", "\u00e9\u0000"])
def test_ids_that_name_nothing_are_missing_never_invalid(
    provider: RunningProvider, vm_id: str
) -> None:
    stub = provider.stub
    assert not stub.Describe(pb.DescribeRequest(id=vm_id), timeout=5).exists
    stub.Delete(pb.DeleteRequest(id=vm_id), timeout=5)
    not_found = grpc.StatusCode.NOT_FOUND
    assert code_of(stub.Power, pb.PowerRequest(id=vm_id, op=pb.POWER_OP_ON)) is not_found
    assert code_of(stub.Reconfigure, pb.ReconfigureRequest(id=vm_id)) is not_found
    assert code_of(stub.HardwareUpgrade, pb.HardwareUpgradeRequest(id=vm_id)) is not_found
    assert code_of(stub.SnapshotCreate, pb.SnapshotCreateRequest(vm_id=vm_id)) is not_found
    assert code_of(stub.SnapshotDelete, pb.SnapshotDeleteRequest(vm_id=vm_id)) is not_found
    assert code_of(stub.SnapshotRevert, pb.SnapshotRevertRequest(vm_id=vm_id)) is not_found
    clone = pb.CloneRequest(source_vm_id=vm_id, target_name="e2e-clone")
    assert code_of(stub.Clone, clone) is not_found
    assert code_of(stub.GetDiskInfo, pb.GetDiskInfoRequest(vm_id=vm_id)) is not_found
    export = pb.ExportDiskRequest(
        vm_id=vm_id, destination_url="pvc://m/x.qcow2", backend_type="pvc", transfer_mode="relay"
    )
    assert code_of(stub.ExportDisk, export) is not_found


def test_power_unspecified_is_invalid_argument(provider: RunningProvider) -> None:
    vm_id = create_vm(provider.stub, "e2e-unspec")
    request = pb.PowerRequest(id=vm_id, op=pb.POWER_OP_UNSPECIFIED)
    assert code_of(provider.stub.Power, request) is grpc.StatusCode.INVALID_ARGUMENT
    request = pb.PowerRequest(id=vm_id, op=7)  # type: ignore[arg-type]
    assert code_of(provider.stub.Power, request) is grpc.StatusCode.INVALID_ARGUMENT


def test_graceful_shutdown_is_a_task_any_replica_can_answer(provider: RunningProvider) -> None:
    stub = provider.stub
    vm_id = create_vm(stub, "e2e-graceful")
    stub.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_ON), timeout=5)
    provider.fake.guest_honors_shutdown = False
    request = pb.PowerRequest(
        id=vm_id, op=pb.POWER_OP_SHUTDOWN_GRACEFUL, graceful_timeout_seconds=60
    )
    task = stub.Power(request, timeout=5).task
    assert task.id
    assert stub.Power(request, timeout=5).task.id == task.id
    assert not stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=5).done
    other = start_provider(shared_with=provider)
    try:
        provider.clock.advance(61)
        status = other.stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=5)
        assert status.done
        assert status.error == ""
        assert stub.Describe(pb.DescribeRequest(id=vm_id), timeout=5).power_state == "Off"
    finally:
        other.channel.close()
        other.application.stop(0)
    stopped = stub.Power(request, timeout=5)
    assert not stopped.HasField("task")  # already off: a quick no-op


def test_task_status_of_unknown_ids_is_done_with_an_error(provider: RunningProvider) -> None:
    status = provider.stub.TaskStatus(pb.TaskStatusRequest(task=pb.TaskRef(id="nope")), timeout=5)
    assert status.done
    assert "nope" in status.error


def test_reconfigure_really_changes_the_vm(provider: RunningProvider) -> None:
    stub = provider.stub
    vm_id = create_vm(stub, "e2e-reconf", disks_json='[{"SizeGiB": 5, "Type": "", "Name": ""}]')
    desired = {
        "Name": "e2e-reconf",
        "Class": {"CPU": 4, "MemoryMiB": 4096, "DiskDefaults": {"SizeGiB": 40}},
        "Disks": [{"SizeGiB": 8}],
        "Tags": None,
    }
    response = stub.Reconfigure(
        pb.ReconfigureRequest(id=vm_id, desired_json=json.dumps(desired)), timeout=5
    )
    assert not response.HasField("task")
    vm = next(vm for vm in stub.ListVMs(pb.ListVMsRequest(), timeout=5).vms if vm.id == vm_id)
    assert (vm.cpu, vm.memory_mib) == (4, 4096)
    assert [disk.size_gib for disk in vm.disks] == [40, 8]
    shrink = pb.ReconfigureRequest(id=vm_id, desired_json='{"Disks": [{"SizeGiB": 1}]}')
    assert code_of(stub.Reconfigure, shrink) is grpc.StatusCode.FAILED_PRECONDITION


def test_snapshots_clone_image_and_disks(provider: RunningProvider) -> None:
    stub = provider.stub
    vm_id = create_vm(stub, "e2e-src", image_json='{"Path": "/images/base.qcow2"}')
    snapshot = stub.SnapshotCreate(
        pb.SnapshotCreateRequest(vm_id=vm_id, name_hint="before", include_memory=True), timeout=5
    )
    assert snapshot.snapshot_id == "before"
    stub.SnapshotRevert(pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id="before"), timeout=5)
    clone = stub.Clone(
        pb.CloneRequest(
            source_vm_id=vm_id,
            target_name="e2e-linked",
            linked=True,
            class_json='{"cpu": 3, "memory": "2Gi"}',
        ),
        timeout=5,
    )
    assert clone.target_vm_id
    cloned = next(
        vm for vm in stub.ListVMs(pb.ListVMsRequest(), timeout=5).vms if vm.id == clone.target_vm_id
    )
    assert (cloned.cpu, cloned.memory_mib) == (3, 2048)
    disk = stub.GetDiskInfo(pb.GetDiskInfoRequest(vm_id=clone.target_vm_id), timeout=5)
    assert disk.backing_file
    assert disk.is_bootable
    stub.SnapshotDelete(pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id="before"), timeout=5)
    missing = pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id="before")
    assert code_of(stub.SnapshotRevert, missing) is grpc.StatusCode.NOT_FOUND
    image = stub.ImagePrepare(
        pb.ImagePrepareRequest(
            image_json='{"source": {"libvirt": {"path": "/images/base.qcow2"}}}', target_name="gold"
        ),
        timeout=5,
    )
    assert (image.prepared_image_id, image.prepared_image_path) != ("", "")
    assert not image.HasField("task")
    export = stub.ExportDisk(
        pb.ExportDiskRequest(
            vm_id=vm_id,
            destination_url="pvc://mig/a.qcow2",
            credentials={"accessKeyID": "x"},
            backend_type="pvc",
            transfer_mode="relay",
        ),
        timeout=5,
    )
    assert export.export_id
    assert export.estimated_size_bytes > 0
    imported = stub.ImportDisk(
        pb.ImportDiskRequest(
            source_url="pvc://mig/a.qcow2",
            target_name="restored",
            backend_type="pvc",
            transfer_mode="relay",
        ),
        timeout=5,
    )
    assert imported.disk_id == "restored"
    upgrade = stub.HardwareUpgrade(pb.HardwareUpgradeRequest(id=vm_id, target_version=0), timeout=5)
    assert not upgrade.HasField("task")


def test_capabilities_are_honest(provider: RunningProvider) -> None:
    caps = provider.stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=5)
    assert caps.supports_snapshots
    assert caps.supports_linked_clones
    assert "pvc" in caps.supported_export_backends


def test_list_vms_reports_every_vm_with_its_disks(provider: RunningProvider) -> None:
    ids = {create_vm(provider.stub, f"e2e-list-{index}") for index in range(5)}
    listed = provider.stub.ListVMs(pb.ListVMsRequest(), timeout=5).vms
    assert {vm.id for vm in listed} == ids
    for vm in listed:
        assert vm.power_state in ("On", "Off")
        assert vm.disks[0].size_gib == 20
        assert vm.disks[0].format == "qcow2"


def test_a_hypervisor_outage_is_unavailable_not_unknown(provider: RunningProvider) -> None:
    provider.fake.faults.fail("describe", ProviderError.unavailable("libvirtd is down"))
    code = code_of(provider.stub.Describe, pb.DescribeRequest(id="x"))
    assert code is grpc.StatusCode.UNAVAILABLE


def test_a_bug_is_internal_and_the_server_keeps_serving(provider: RunningProvider) -> None:
    def broken() -> None:
        raise RuntimeError("a bug")

    provider.fake.faults.on_entry("describe", broken)
    assert code_of(provider.stub.Describe, pb.DescribeRequest(id="x")) is grpc.StatusCode.INTERNAL
    assert provider.stub.Validate(pb.ValidateRequest(), timeout=5).ok


MUTATION_SLOTS = 8  # PYRIGAUD_MAX_CONCURRENT_OPS's default
HELD_SECONDS = 60  # a liveness bound on the held Creates, never reached: the test lets them go


class HeldCreates:
    """The fake's Creates held on entry, each in a mutation slot, until `let_go`."""

    def __init__(self, provider: RunningProvider) -> None:
        self.entered = threading.Semaphore(0)
        self.released = threading.Event()
        provider.fake.faults.on_entry("create", self._hold)

    def _hold(self) -> None:
        self.entered.release()
        self.released.wait(HELD_SECONDS)

    def wait_for(self, count: int) -> None:
        for held in range(count):
            assert self.entered.acquire(timeout=HELD_SECONDS), f"only {held} Creates came in"

    def let_go(self) -> None:
        self.released.set()


def create_held(stub: pb_grpc.ProviderStub, name: str) -> None:
    """A Create that may be held, or refused RESOURCE_EXHAUSTED beyond the bound."""
    with contextlib.suppress(grpc.RpcError):
        stub.Create(pb.CreateRequest(name=name, class_json=CLASS_JSON), timeout=HELD_SECONDS)


def test_creates_holding_every_slot_never_stall_describe(provider: RunningProvider) -> None:
    """More Creates than mutation slots, every slot held: reads still answer (they take no
    slot) while the Creates are held."""
    vm_id = create_vm(provider.stub, "e2e-hot")
    held = HeldCreates(provider)
    pool = ThreadPoolExecutor(12)
    futures = [pool.submit(create_held, provider.stub, f"e2e-slow-{i}") for i in range(12)]
    try:
        held.wait_for(MUTATION_SLOTS)
        for _ in range(20):
            assert provider.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=30).exists
            assert provider.stub.Validate(pb.ValidateRequest(), timeout=30).ok
    finally:
        held.let_go()
        for future in futures:
            future.result()
        pool.shutdown()


def test_mutations_beyond_the_bound_wait_then_get_resource_exhausted(
    provider: RunningProvider,
) -> None:
    held = HeldCreates(provider)
    pool = ThreadPoolExecutor(MUTATION_SLOTS)
    blockers = [
        pool.submit(create_held, provider.stub, f"e2e-block-{i}") for i in range(MUTATION_SLOTS)
    ]
    try:
        held.wait_for(MUTATION_SLOTS)  # every slot is held
        request = pb.CreateRequest(name="e2e-late", class_json=CLASS_JSON)
        with pytest.raises(grpc.RpcError) as raised:
            provider.stub.Create(request, timeout=2)
        assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "too many operations" in (raised.value.details() or "")
    finally:
        held.let_go()
        for blocker in blockers:
            blocker.result()
        pool.shutdown()
