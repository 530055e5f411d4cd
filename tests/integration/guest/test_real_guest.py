"""A real guest through gRPC: prepared image → Create with cloud-init → boot → our seed read →
address reported → memory snapshot and revert → graceful shutdown by the guest itself →
linked clone boots → Delete leaves nothing behind.

The tests run in file order on one source VM (each first puts it in the power state it needs,
so a failure reads plainly). At most two guests run at once, each with 256 MiB.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any

import libvirt
import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.guest import (
    POWEROFF,
    READY,
    SEED,
    console,
    guest_exec,
    guest_spawn,
    pool_volume_names,
    shutoff_reason,
    wait_for_agent,
    wait_for_agent_gone,
)
from support.qemu import disk_sources
from support.replica import Replica

pytestmark = pytest.mark.timeout(300)

SOURCE = "guest-e2e-source"
CLONE = "guest-e2e-clone"
CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256})
TOKEN = secrets.token_hex(8)
USER_DATA = f"#cloud-config\n# pyrigaud real-guest test {TOKEN}\n".encode()
META_DATA = f"instance-id: guest-e2e-{TOKEN}\nlocal-hostname: {SOURCE}\n".encode()
# Bounds on waits, generous for a loaded 2-core machine; none of them is a speed check.
BOOT_SECONDS = 120
TASK_SECONDS = 120
ADDRESS_SECONDS = 90
AGENT_GONE_SECONDS = 30
GRACEFUL_SECONDS = 90  # the shutdown deadline: past it the provider would force the power-off
USER_MODE_ADDRESS = "10.0.2.15"  # QEMU's user-mode DHCP answer, inside QEMU only


def settle(stub: pb_grpc.ProviderStub, task: pb.TaskRef, seconds: float = TASK_SECONDS) -> None:
    """Poll a task (if any) until done, bounded; a task that ends in an error fails the test."""
    deadline = time.monotonic() + seconds
    while task.id:
        status = stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=10)
        if status.done:
            assert not status.error, f"task {task.id} failed: {status.error}"
            return
        assert time.monotonic() < deadline, f"task {task.id} not done in {seconds} s"
        time.sleep(0.5)


def power(stub: pb_grpc.ProviderStub, vm_id: str, op: pb.PowerOp.ValueType) -> None:
    settle(stub, stub.Power(pb.PowerRequest(id=vm_id, op=op), timeout=120).task)


def describe(stub: pb_grpc.ProviderStub, vm_id: str) -> pb.DescribeResponse:
    return stub.Describe(pb.DescribeRequest(id=vm_id), timeout=30)


def boot(provider: Replica, conn: Any, vm_id: str) -> float:
    """Power ON through gRPC, wait for the ready marker; the guest's uptime when it got there."""
    started = time.monotonic()
    power(provider.stub, vm_id, pb.POWER_OP_ON)
    with console(conn, conn.lookupByUUIDString(vm_id)) as serial:
        ready = serial.wait_for(READY, BOOT_SECONDS)
    took = time.monotonic() - started
    # Printed for the figures in docs/testing.md (`-s` shows them); not asserted.
    print(f"{vm_id}: ready {took:.1f} s after Power ON (kernel uptime {ready['uptime']} s)")
    return float(ready["uptime"])


@pytest.fixture(scope="module")
def source(provider: Replica, prepared_image: str) -> str:
    request = pb.CreateRequest(
        name=SOURCE,
        class_json=CLASS_JSON,
        image_json=json.dumps({"Path": prepared_image, "Format": "qcow2"}),
        user_data=USER_DATA,
        meta_data=META_DATA,
    )
    created = provider.stub.Create(request, timeout=300)
    settle(provider.stub, created.task)
    assert describe(provider.stub, created.id).power_state == "Off"
    return created.id


@pytest.fixture
def running_source(provider: Replica, conn: Any, source: str) -> Any:
    """The source VM on, its agent answering: the libvirt domain."""
    if describe(provider.stub, source).power_state != "On":
        boot(provider, conn, source)
    dom = conn.lookupByUUIDString(source)
    wait_for_agent(dom, BOOT_SECONDS)
    return dom


def test_the_guest_boots_from_the_prepared_image_and_reads_our_seed(
    provider: Replica, conn: Any, source: str, prepared_image: str
) -> None:
    dom = conn.lookupByUUIDString(source)
    root_disk = disk_sources(dom)[0]
    assert conn.storageVolLookupByPath(root_disk).path() != prepared_image  # an overlay
    boot(provider, conn, source)
    with console(conn, dom) as serial:
        seed = serial.wait_for(SEED, BOOT_SECONDS)
    assert seed["user"] == hashlib.sha256(USER_DATA).hexdigest(), seed.group(0)
    assert seed["meta"] == hashlib.sha256(META_DATA).hexdigest(), seed.group(0)


def test_describe_reports_the_guest_address(provider: Replica, running_source: Any) -> None:
    # Read through the guest agent; the address lives inside QEMU's user-mode network.
    deadline = time.monotonic() + ADDRESS_SECONDS
    described = describe(provider.stub, running_source.UUIDString())
    while USER_MODE_ADDRESS not in described.ips:
        assert time.monotonic() < deadline, f"no guest address in {ADDRESS_SECONDS} s: {described}"
        time.sleep(1)
        described = describe(provider.stub, running_source.UUIDString())
    assert described.power_state == "On"
    assert not [ip for ip in described.ips if ip.startswith(("127.", "fe80:", "::1"))]


def test_a_memory_snapshot_brings_back_the_running_guest_and_its_memory(
    provider: Replica, running_source: Any
) -> None:
    vm_id = running_source.UUIDString()
    # The guest lives in its initramfs: /tmp is RAM, so these files are memory state.
    assert guest_exec(running_source, "/bin/sh", "-c", "touch /tmp/before-snapshot").code == 0
    request = pb.SnapshotCreateRequest(
        vm_id=vm_id, name_hint="warm", include_memory=True, description="before"
    )
    snapshot = provider.stub.SnapshotCreate(request, timeout=300)
    settle(provider.stub, snapshot.task)
    assert snapshot.snapshot_id
    assert guest_exec(running_source, "/bin/sh", "-c", "touch /tmp/after-snapshot").code == 0

    revert = pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id=snapshot.snapshot_id)
    settle(provider.stub, provider.stub.SnapshotRevert(revert, timeout=300).task)

    assert describe(provider.stub, vm_id).power_state == "On"
    wait_for_agent(running_source, BOOT_SECONDS)
    assert guest_exec(running_source, "/bin/sh", "-c", "test -e /tmp/before-snapshot").code == 0
    assert guest_exec(running_source, "/bin/sh", "-c", "test -e /tmp/after-snapshot").code == 1


def shut_down_gracefully(provider: Replica, conn: Any, dom: Any) -> str:
    """SHUTDOWN_GRACEFUL through gRPC until its task is done; how the guest was asked (the
    marker its power-off script prints: `agent` or `acpi`)."""
    vm_id = dom.UUIDString()
    request = pb.PowerRequest(
        id=vm_id, op=pb.POWER_OP_SHUTDOWN_GRACEFUL, graceful_timeout_seconds=GRACEFUL_SECONDS
    )
    with console(conn, dom) as serial:
        offset = len(serial.text)
        task = provider.stub.Power(request, timeout=120).task
        poweroff = serial.wait_for(POWEROFF, GRACEFUL_SECONDS, after=offset)
    settle(provider.stub, task, GRACEFUL_SECONDS)
    # Stopped by the guest, not by the provider's hard fallback (that would be DESTROYED).
    assert shutoff_reason(dom) == libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN
    assert describe(provider.stub, vm_id).power_state == "Off"
    return poweroff["via"]


def test_a_graceful_shutdown_goes_through_the_agent_and_the_guest_obeys(
    provider: Replica, conn: Any, running_source: Any
) -> None:
    assert shut_down_gracefully(provider, conn, running_source) == "agent"


def test_a_linked_clone_of_the_stopped_guest_boots(
    provider: Replica, conn: Any, source: str
) -> None:
    power(provider.stub, source, pb.POWER_OP_OFF)  # a linked clone needs its source off
    request = pb.CloneRequest(source_vm_id=source, target_name=CLONE, linked=True)
    cloned = provider.stub.Clone(request, timeout=300)
    settle(provider.stub, cloned.task)
    assert cloned.target_vm_id
    assert cloned.target_vm_id != source
    clone = conn.lookupByUUIDString(cloned.target_vm_id)
    clone_disk = conn.storageVolLookupByPath(disk_sources(clone)[0])
    source_disk = disk_sources(conn.lookupByUUIDString(source))[0]
    assert source_disk in clone_disk.XMLDesc(0), "a linked clone's disk overlays the source's"
    boot(provider, conn, cloned.target_vm_id)


def test_without_an_agent_a_graceful_shutdown_goes_through_acpi(
    provider: Replica, conn: Any
) -> None:
    clone = conn.lookupByName(CLONE)
    assert clone.isActive(), "the linked clone test left it running"
    wait_for_agent(clone, BOOT_SECONDS)
    guest_spawn(clone, "/bin/sh", "-c", "kill $(cat /run/qemu-ga.pid)")
    wait_for_agent_gone(clone, AGENT_GONE_SECONDS)
    assert shut_down_gracefully(provider, conn, clone) == "acpi"


def test_deleting_both_leaves_only_the_prepared_image_in_the_pool(
    provider: Replica, conn: Any, pool: Any, source: str, prepared_image: str
) -> None:
    clone = conn.lookupByName(CLONE).UUIDString()
    for vm_id in (clone, source):  # the clone first: the source's disk backs it
        settle(provider.stub, provider.stub.Delete(pb.DeleteRequest(id=vm_id), timeout=120).task)
        assert not describe(provider.stub, vm_id).exists
    assert pool_volume_names(pool) == {conn.storageVolLookupByPath(prepared_image).name()}
