"""A `pyrigaud serve` on vSphere killed with SIGKILL in the middle of a Create.

A Create is one clone task, which vCenter finishes whoever asked for it: killed while the clone
runs, the provider leaves a complete VM (or none), and the next Create of the name returns it.
Only a Create asking for a hardware version (which a clone cannot set) is made in steps, marked
as building until the last one. The simulator finishes each task inside its SOAP call, so the
tests hold one step open with the launcher's method delays: the clone itself, or the
UpgradeVM_Task that runs after the clone and before the reconfigure that clears the building
mark, which the next process's start-up sweep must then remove.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.replica import Replica
from support.vsphere import TEMPLATE_VM, Simulator, running_simulator

HELD_STEP = "UpgradeVM_Task"
HELD_MILLISECONDS = 4000
HELD_CLONE_MILLISECONDS = 8000
# Ample time for the Create to read the inventory and ask for the clone, well inside the hold.
KILL_AFTER_SECONDS = 4.0
NAME = "crash-vsphere"
SETTLE_SECONDS = 60


@pytest.fixture
def slow_upgrades() -> Iterator[Simulator]:
    with running_simulator("-method-delay", f"{HELD_STEP}={HELD_MILLISECONDS}") as simulator:
        yield simulator


def environ(simulator: Simulator, **extra: str) -> dict[str, str]:
    return simulator.serve_environ(PROVIDER_NAMESPACE="ns", PROVIDER_NAME="crash", **extra)


def test_a_create_killed_part_way_is_swept_by_the_next_process(
    slow_upgrades: Simulator, tmp_path: Path
) -> None:
    watcher = slow_upgrades.backend()
    replica = Replica(environ(slow_upgrades), tmp_path / "killed")
    request = pb.CreateRequest(
        name=NAME,
        class_json=json.dumps(
            {"CPU": 1, "MemoryMiB": 256, "ExtraConfig": {"vsphere.hardwareVersion": "15"}}
        ),
        image_json=json.dumps({"TemplateName": TEMPLATE_VM}),
    )

    def clone_exists() -> None:  # the held upgrade keeps the Create from finishing
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline and watcher.lifecycle.find_by_name(NAME).unwrap() is None:
            time.sleep(0.05)

    kill_during_create(replica, request, clone_exists)
    leftover = watcher.lifecycle.find_by_name(NAME).unwrap()
    assert leftover is not None
    assert leftover.building_since is not None

    survivor = Replica(
        environ(slow_upgrades, PYRIGAUD_ABANDONED_AFTER_SECONDS="0"), tmp_path / "next"
    )
    try:
        swept = f"killed part-way: VM {NAME!r}"
        assert survivor.logged(swept, SETTLE_SECONDS)  # the start-up sweep has run
        assert watcher.lifecycle.find_by_name(NAME).unwrap() is None
    finally:
        survivor.stop()


def test_a_create_killed_while_its_clone_runs_leaves_a_complete_vm_the_next_create_returns(
    tmp_path: Path,
) -> None:
    delay = f"CloneVM_Task={HELD_CLONE_MILLISECONDS}"
    with running_simulator("-method-delay", delay) as simulator:
        watcher = simulator.backend()
        replica = Replica(environ(simulator), tmp_path / "killed")
        request = pb.CreateRequest(
            name=NAME,
            class_json=json.dumps({"CPU": 2, "MemoryMiB": 512}),
            image_json=json.dumps({"TemplateName": TEMPLATE_VM}),
        )
        # The clone was asked for and is still held by the simulator.
        kill_during_create(replica, request, lambda: time.sleep(KILL_AFTER_SECONDS))
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline and watcher.lifecycle.find_by_name(NAME).unwrap() is None:
            time.sleep(0.2)
        record = watcher.lifecycle.find_by_name(NAME).unwrap()
        assert record is not None, "vCenter finishes a clone whoever asked for it"
        assert record.building_since is None
        assert watcher.lifecycle.find_unfinished().unwrap() == []
        info = watcher.inventory.vm_info(record.id).unwrap()
        assert info is not None
        assert (info.cpu, info.memory_mib) == (2, 512)

        survivor = Replica(environ(simulator), tmp_path / "next")
        try:
            again = survivor.stub.Create(request, timeout=60)
        finally:
            survivor.stop()
        assert (again.id, again.task.id) == (record.id, "")
        assert [vm.id for vm in watcher.inventory.list_vms().unwrap() if vm.name == NAME] == [
            record.id
        ]


def kill_during_create(
    replica: Replica, request: pb.CreateRequest, until: Callable[[], object]
) -> None:
    """Create through `replica` and SIGKILL it once `until` returns, before Create answers."""
    failures: list[grpc.RpcError] = []

    def create() -> None:
        try:
            replica.stub.Create(request, timeout=60)
        except grpc.RpcError as error:
            failures.append(error)

    caller = threading.Thread(target=create)
    caller.start()
    try:
        until()
    finally:
        replica.kill()
        caller.join(timeout=30)
    assert failures, "the Create finished before the provider was killed"
