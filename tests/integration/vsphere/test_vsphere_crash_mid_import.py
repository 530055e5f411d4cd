"""A `pyrigaud serve` on vSphere killed with SIGKILL in the middle of an ImportDisk.

The import's transient VM exists from ImportVApp until it is unregistered; it carries the
building mark all that time. The simulator finishes the lease's steps inside their SOAP calls,
so the launcher's method delay holds HttpNfcLeaseComplete open (the bytes are uploaded, the
lease not yet completed) and the provider is killed there. The leftover is not taken for an
imported disk (a retry answers UNAVAILABLE, not the disk nor ALREADY_EXISTS), the next
process's start-up sweep removes it with its folder, and the import then succeeds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pyrigaud.adapters.hypervisors.vsphere import datastore_files
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support import ok, wait_until
from support.replica import Replica
from support.vsphere import Simulator, running_simulator

HELD_STEP = "HttpNfcLeaseComplete"
HELD_MILLISECONDS = 6000
NAME = "crash-import"
DISK_BYTES = 2 * 1024 * 1024
DATASTORE = "LocalDS_0"
SETTLE_SECONDS = 60


@pytest.fixture
def slow_completion() -> Iterator[Simulator]:
    with running_simulator("-method-delay", f"{HELD_STEP}={HELD_MILLISECONDS}") as simulator:
        yield simulator


def _environ(simulator: Simulator, root: Path, **extra: str) -> dict[str, str]:
    return simulator.serve_environ(
        PROVIDER_NAMESPACE="ns",
        PROVIDER_NAME="crash-import",
        PROVIDER_DEFAULT_DATASTORE=DATASTORE,
        PYRIGAUD_MIGRATION_STORAGE_ROOT=str(root),
        **extra,
    )


def _request() -> pb.ImportDiskRequest:
    return pb.ImportDiskRequest(
        source_url="pvc://mig/disk.raw",
        format="raw",
        target_name=NAME,
        backend_type="pvc",
        transfer_mode="relay",
    )


def test_an_import_killed_part_way_is_swept_and_then_succeeds(
    slow_completion: Simulator, tmp_path: Path
) -> None:
    root = tmp_path / "migration-storage"
    (root / "mig").mkdir(parents=True)
    (root / "mig" / "disk.raw").write_bytes(os.urandom(DISK_BYTES))
    watcher = slow_completion.backend()
    killed = Replica(_environ(slow_completion, root), tmp_path / "killed")
    failures: list[grpc.RpcError] = []

    def import_disk() -> None:
        try:
            killed.stub.ImportDisk(_request(), timeout=60)
        except grpc.RpcError as error:
            failures.append(error)

    caller = threading.Thread(target=import_disk)
    caller.start()
    try:
        # Killed once the transient VM exists and the provider has read every byte of the
        # disk: its upload ends, and the completion is held, after that.
        wait_until(
            lambda: watcher.lifecycle.find_by_name(NAME).unwrap() is not None,
            SETTLE_SECONDS,
            "the import's transient VM",
        )
        wait_until(
            lambda: (
                killed.metric("pyrigaud_transfer_bytes_total", direction="import") >= DISK_BYTES
            ),
            SETTLE_SECONDS,
            "every byte of the staged disk read",
        )
    finally:
        killed.kill()
        caller.join(timeout=30)
    assert failures, "the import finished before the provider was killed"
    leftover = watcher.lifecycle.find_by_name(NAME).unwrap()
    assert leftover is not None
    assert leftover.building_since is not None

    retried = Replica(_environ(slow_completion, root), tmp_path / "retried")
    try:
        with pytest.raises(grpc.RpcError) as refused:
            retried.stub.ImportDisk(_request(), timeout=60)
    finally:
        retried.stop()
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE, refused.value.details()

    survivor = Replica(
        _environ(slow_completion, root, PYRIGAUD_ABANDONED_AFTER_SECONDS="0"), tmp_path / "next"
    )
    try:
        assert survivor.logged(f"killed part-way: VM {NAME!r}", SETTLE_SECONDS)
        assert watcher.lifecycle.find_by_name(NAME).unwrap() is None
        session = slow_completion.session()
        folder_left = ok(
            session.call(lambda instance: datastore_files.exists(instance, f"[{DATASTORE}] {NAME}"))
        )
        session.close()
        assert not folder_left
        imported = survivor.stub.ImportDisk(_request(), timeout=120)
        assert imported.path.startswith(f"[{DATASTORE}] {NAME}/")
    finally:
        survivor.stop()
