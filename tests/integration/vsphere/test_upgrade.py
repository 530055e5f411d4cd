"""Upgrade safety: what a running provider of an earlier release leaves on vCenter is read and
operated by the code under test (docs/upgrades.md lists that state).

The release at BASELINE, installed from this repository's history (support/release.py), serves
the simulator first: it makes two VMs, powers them (vSphere task ids and a graceful-shutdown
task id), takes a snapshot, imports a staged disk (its folder, disk and import record), answers
a task id on the launcher's held task (a task the manager would still poll), and is killed with
SIGKILL in the middle of a second import (its transient VM, marked as building). A staged
temporary named by its own rule stands for an export it was cut off in.

Then the code under test serves the same simulator, and its answers are held to the release's:
Describe, ListVMs and TaskStatus answer what the release answered, the first import retried
answers the same disk from its record, the start-up sweep removes the release's leftovers and
nothing else, the snapshot is reverted to and deleted, the cut-off import succeeds once
retried, a VM is made around the imported disk, and a VM the release made is deleted.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from pyrigaud.adapters.hypervisors.vsphere import datastore_files
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support import ok, wait_until
from support.release import release_command, release_python
from support.replica import Replica, listed_vms
from support.vsphere import SIMULATOR_DATASTORE, TEMPLATE_VM, Simulator, running_simulator

# The release whose on-hypervisor state the code under test must operate: main as it was before
# the disk-transfer refactoring (938c83c and after) rewrote the code that writes import folders,
# import records and marks. Move it forward to the last release actually deployed, or to the
# last revision before a change of on-hypervisor state; docs/upgrades.md says how.
BASELINE = "5fae56b"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a cold run builds the release's venv

NAMESPACE, PROVIDER = "upgrade", "pyrigaud"  # the same for both releases
OWNER = f"{NAMESPACE}/{PROVIDER}"  # the owner mark they make of them
OTHER_OWNER = "upgrade/another-provider"
HELD_STEP = "HttpNfcLeaseComplete"  # held open so the release can be killed mid-import
HELD_MILLISECONDS = 3000
CLASS_JSON = '{"CPU":1,"MemoryMiB":256}'
IMAGE_JSON = json.dumps({"TemplateName": TEMPLATE_VM})
RUNNING, STOPPED = "upgrade-running", "upgrade-stopped"
IMPORTED, CUT_OFF = "upgrade-imported", "upgrade-cut-off"
SETTLE_SECONDS = 60
LONG_AGO_SECONDS = 7 * 24 * 3600  # older than any transfer deadline


@dataclass
class Legacy:
    """What the release left on the hypervisor and in the staging PVC, and what it answered."""

    root: Path  # PYRIGAUD_MIGRATION_STORAGE_ROOT
    vms: dict[str, str] = field(default_factory=dict)  # name -> id
    described: dict[str, pb.DescribeResponse] = field(default_factory=dict)
    tasks: dict[str, tuple[pb.TaskRef, pb.TaskStatusResponse]] = field(default_factory=dict)
    imported: pb.ImportDiskResponse = field(default_factory=pb.ImportDiskResponse)
    held: pb.TaskRef = field(default_factory=pb.TaskRef)  # a task id on the held task
    snapshot: str = ""  # the id of a snapshot of STOPPED
    staged_temporary: Path = Path()  # the release's, of an export cut off long ago
    others_temporary: Path = Path()  # another provider's: no sweep of ours touches it


@dataclass
class Upgraded:
    simulator: Simulator
    legacy: Legacy
    served: Replica  # the code under test on the same simulator

    @property
    def stub(self) -> pb_grpc.ProviderStub:
        return self.served.stub


def _environ(simulator: Simulator, root: Path, **extra: str) -> dict[str, str]:
    return simulator.serve_environ(
        PROVIDER_NAMESPACE=NAMESPACE,
        PROVIDER_NAME=PROVIDER,
        PROVIDER_DEFAULT_DATASTORE=SIMULATOR_DATASTORE,
        PYRIGAUD_MIGRATION_STORAGE_ROOT=str(root),
        **extra,
    )


def _import_request(staged: str, target: str) -> pb.ImportDiskRequest:
    return pb.ImportDiskRequest(
        source_url=f"pvc://mig/{staged}",
        format="raw",
        target_name=target,
        backend_type="pvc",
        transfer_mode="relay",
    )


def _settled(stub: pb_grpc.ProviderStub, task: pb.TaskRef) -> pb.TaskStatusResponse:
    """TaskStatus once done (bounded; no task: done at once); a failed task fails the test."""
    if not task.id:
        return pb.TaskStatusResponse(done=True)
    deadline = time.monotonic() + SETTLE_SECONDS
    status = stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=30)
    while not status.done and time.monotonic() < deadline:
        time.sleep(0.2)
        status = stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=30)
    assert status.done, f"task {task.id} not done in {SETTLE_SECONDS} s"
    assert not status.error, f"task {task.id}: {status.error}"
    return status


def _on_held_task(task: pb.TaskRef, held_task: str) -> pb.TaskRef:
    """The release's vSphere task id `task` with the launcher's held task in place of its own:
    the id the release hands out for a task vCenter is still running."""
    prefix, _, rest = task.id.partition(":")
    _, _, vm_id = rest.partition(":")
    assert prefix == "vsphere-task", f"not a vSphere task id: {task.id!r}"
    assert vm_id, f"no VM in the task id {task.id!r}"
    return pb.TaskRef(id=f"{prefix}:{held_task}:{vm_id}")


def _temporary_name(python: Path, final_name: str, owner: str, started_at: float) -> str:
    """A staged temporary's name as the release names one (its own function, in its venv)."""
    named = subprocess.run(
        [
            str(python),
            "-c",
            "import sys\n"
            "from pyrigaud.domain.staging_names import temporary_name\n"
            "print(temporary_name(sys.argv[1], sys.argv[2], float(sys.argv[3]), '0badc0de'))",
            final_name,
            owner,
            str(started_at),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return named.stdout.strip()


def _serve_the_release(simulator: Simulator, home: Path) -> Legacy:
    """Everything the release does before it is killed mid-import (see the module's docstring)."""
    legacy = Legacy(root=home / "migration-storage")
    (legacy.root / "mig").mkdir(parents=True)
    (legacy.root / "mig" / "disk.raw").write_bytes(os.urandom(2 * 1024 * 1024))
    (legacy.root / "mig" / "cut.raw").write_bytes(os.urandom(2 * 1024 * 1024))
    release = Replica(
        _environ(simulator, legacy.root), home / "release", command=release_command(BASELINE)
    )
    try:
        stub = release.stub
        for name in (RUNNING, STOPPED):
            created = stub.Create(
                pb.CreateRequest(name=name, class_json=CLASS_JSON, image_json=IMAGE_JSON),
                timeout=90,
            )
            legacy.vms[name] = created.id
            legacy.tasks[f"create {name}"] = (created.task, _settled(stub, created.task))
            on = stub.Power(pb.PowerRequest(id=created.id, op=pb.POWER_OP_ON), timeout=60).task
            legacy.tasks[f"power on {name}"] = (on, _settled(stub, on))
        shutdown = stub.Power(
            pb.PowerRequest(
                id=legacy.vms[STOPPED],
                op=pb.POWER_OP_SHUTDOWN_GRACEFUL,
                graceful_timeout_seconds=600,
            ),
            timeout=60,
        ).task
        legacy.tasks[f"shutdown {STOPPED}"] = (shutdown, _settled(stub, shutdown))
        snapshot = stub.SnapshotCreate(
            pb.SnapshotCreateRequest(vm_id=legacy.vms[STOPPED], name_hint="before-upgrade"),
            timeout=60,
        )
        legacy.snapshot = snapshot.snapshot_id
        legacy.tasks[f"snapshot {STOPPED}"] = (snapshot.task, _settled(stub, snapshot.task))
        legacy.held = _on_held_task(legacy.tasks[f"power on {RUNNING}"][0], simulator.held_task)
        assert not stub.TaskStatus(pb.TaskStatusRequest(task=legacy.held), timeout=30).done
        legacy.imported = stub.ImportDisk(_import_request("disk.raw", IMPORTED), timeout=120)
        for name, vm_id in legacy.vms.items():
            legacy.described[name] = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=30)
    except BaseException:
        release.kill()
        raise
    _kill_mid_import(simulator, release)
    # Written once the release is gone: its own start-up sweep would have removed its own.
    python = release_python(BASELINE)
    long_ago = time.time() - LONG_AGO_SECONDS
    legacy.staged_temporary = (
        legacy.root / "mig" / _temporary_name(python, "export.qcow2", OWNER, long_ago)
    )
    legacy.others_temporary = (
        legacy.root / "mig" / _temporary_name(python, "export.qcow2", OTHER_OWNER, long_ago)
    )
    for temporary in (legacy.staged_temporary, legacy.others_temporary):
        temporary.write_bytes(b"part of an export")
    return legacy


def _kill_mid_import(simulator: Simulator, release: Replica) -> None:
    """SIGKILL the release while an import's transient VM exists: the VM stays."""
    watcher = simulator.backend()
    failures: list[grpc.RpcError] = []

    def import_disk() -> None:
        try:
            release.stub.ImportDisk(_import_request("cut.raw", CUT_OFF), timeout=60)
        except grpc.RpcError as error:
            failures.append(error)

    caller = threading.Thread(target=import_disk)
    caller.start()
    try:
        # Killed once the transient VM exists: uploading, or with its completion held (the
        # release exposes no count of the bytes it moved); either way the VM stays behind.
        wait_until(
            lambda: watcher.lifecycle.find_by_name(CUT_OFF).unwrap() is not None,
            SETTLE_SECONDS,
            "the release's transient VM",
        )
    finally:
        release.kill()
        caller.join(timeout=30)
    assert failures, "the import finished before the release was killed"
    # Whether its marks are read as those of an unfinished import is the sweep's test.
    assert watcher.lifecycle.find_by_name(CUT_OFF).unwrap() is not None


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upgraded]:
    home = tmp_path_factory.mktemp("upgrade")
    held = ("-held-task", "-method-delay", f"{HELD_STEP}={HELD_MILLISECONDS}")
    with running_simulator(*held) as sim:
        legacy = _serve_the_release(sim, home)
        # Every leftover older than 0 s is abandoned: nothing else runs on this simulator.
        served = Replica(
            _environ(sim, legacy.root, PYRIGAUD_ABANDONED_AFTER_SECONDS="0"), home / "served"
        )
        try:
            yield Upgraded(sim, legacy, served)
        finally:
            served.stop()


def test_the_sweep_removes_what_the_release_left_part_way_and_nothing_else(
    upgraded: Upgraded,
) -> None:
    served, legacy = upgraded.served, upgraded.legacy
    assert served.logged(f"killed part-way: VM {CUT_OFF!r}", SETTLE_SECONDS)
    assert served.logged("removed 1 staged temporaries", SETTLE_SECONDS)
    watcher = upgraded.simulator.backend()
    assert watcher.lifecycle.find_by_name(CUT_OFF).unwrap() is None
    assert not legacy.staged_temporary.exists()
    assert legacy.others_temporary.exists()
    assert {path.name for path in (legacy.root / "mig").iterdir()} == {
        "disk.raw",
        "cut.raw",
        legacy.others_temporary.name,
    }
    for name, vm_id in legacy.vms.items():
        record = watcher.lifecycle.find_by_name(name).unwrap()
        assert record is not None
        assert record.id == vm_id
    session = upgraded.simulator.session()
    try:
        cut_off_folder, imported_disk = session.call(
            lambda instance: (
                ok(datastore_files.exists(instance, f"[{SIMULATOR_DATASTORE}] {CUT_OFF}")),
                ok(datastore_files.exists(instance, legacy.imported.path)),
            )
        )
    finally:
        session.close()
    assert not cut_off_folder
    assert imported_disk


def test_describe_and_list_answer_what_the_release_answered(upgraded: Upgraded) -> None:
    legacy = upgraded.legacy
    answered = {name: (d.exists, d.power_state) for name, d in legacy.described.items()}
    assert answered == {RUNNING: (True, "On"), STOPPED: (True, "Off")}
    for name, vm_id in legacy.vms.items():
        described = upgraded.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=30)
        before = legacy.described[name]
        raw, raw_before = (
            json.loads(described.provider_raw_json),
            json.loads(before.provider_raw_json),
        )
        # The raw JSON may say more than the release did (the devices in use), never otherwise.
        assert {key: raw.get(key) for key in raw_before} == raw_before, name
        described.provider_raw_json = before.provider_raw_json
        assert described == before, name
    listed = {vm.name: vm.id for vm in listed_vms(upgraded.stub)}
    assert {name: listed.get(name) for name in legacy.vms} == legacy.vms


def test_task_ids_the_release_handed_out_are_answered_as_it_answered_them(
    upgraded: Upgraded,
) -> None:
    for doing, (task, answered) in upgraded.legacy.tasks.items():
        if task.id:
            status = upgraded.stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=30)
            assert status == answered, doing
    still_running = upgraded.stub.TaskStatus(
        pb.TaskStatusRequest(task=upgraded.legacy.held), timeout=30
    )
    assert still_running == pb.TaskStatusResponse(done=False)


def test_a_snapshot_the_release_took_is_reverted_to_and_deleted(upgraded: Upgraded) -> None:
    vm_id, snapshot_id = upgraded.legacy.vms[STOPPED], upgraded.legacy.snapshot
    assert snapshot_id
    reverted = upgraded.stub.SnapshotRevert(
        pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id=snapshot_id), timeout=60
    )
    _settled(upgraded.stub, reverted.task)
    deleted = upgraded.stub.SnapshotDelete(
        pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=snapshot_id), timeout=60
    )
    _settled(upgraded.stub, deleted.task)
    with pytest.raises(grpc.RpcError) as gone:
        upgraded.stub.SnapshotRevert(
            pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id=snapshot_id), timeout=60
        )
    assert gone.value.code() is grpc.StatusCode.NOT_FOUND, gone.value.details()


def test_a_retried_import_answers_the_disk_the_release_imported(upgraded: Upgraded) -> None:
    retried = upgraded.stub.ImportDisk(_import_request("disk.raw", IMPORTED), timeout=120)
    assert retried == upgraded.legacy.imported


def test_the_import_the_release_was_cut_off_in_succeeds_once_retried(upgraded: Upgraded) -> None:
    imported = upgraded.stub.ImportDisk(_import_request("cut.raw", CUT_OFF), timeout=120)
    assert imported.path.startswith(f"[{SIMULATOR_DATASTORE}] {CUT_OFF}/")


def test_a_vm_is_made_around_the_disk_the_release_imported(upgraded: Upgraded) -> None:
    image = {"TemplateName": "", "Path": upgraded.legacy.imported.path, "Format": "vmdk"}
    created = upgraded.stub.Create(
        pb.CreateRequest(
            name="upgrade-around-disk", class_json=CLASS_JSON, image_json=json.dumps(image)
        ),
        timeout=90,
    )
    _settled(upgraded.stub, created.task)
    assert upgraded.stub.Describe(pb.DescribeRequest(id=created.id), timeout=30).exists


def test_a_vm_the_release_made_is_deleted(upgraded: Upgraded) -> None:
    vm_id = upgraded.legacy.vms[RUNNING]
    deleted = upgraded.stub.Delete(pb.DeleteRequest(id=vm_id), timeout=60)
    _settled(upgraded.stub, deleted.task)
    assert not upgraded.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=30).exists
    assert upgraded.simulator.backend().lifecycle.find_by_name(RUNNING).unwrap() is None
