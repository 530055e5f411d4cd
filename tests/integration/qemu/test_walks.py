"""docs/architecture.md's three walks, counted on the real thing: Describe of a libvirt VM (a
cache hit), ExportDisk at a snapshot of a running libvirt VM to S3, and ImportDisk of that
staged qcow2 into vSphere (the simulator), each over gRPC to a provider served in this process.

Each walk's depth is the deepest chain of the project's own frames the request ran through
(support/walks.py says what is counted); the test holds the depths the page draws, so a change
that passes a request through more rooms shows here. `pytest -s` prints the chains.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from pyrigaud.adapters.hypervisors.libvirt.storage import upload_volume, volume_xml
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.entrypoints.bootstrap import Application, bootstrap
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc
from pyrigaud.entrypoints.settings import load_settings

from support import ok
from support.migration import TRANSFER_SECONDS, manager_storage, settled
from support.qemu import QEMU_URI, ensure_dir_pool, swept_pool_connection
from support.vsphere import SIMULATOR_DATASTORE, shared_simulator
from support.walks import Walk, WalkRecorder

pytestmark = pytest.mark.timeout(600)

POOL = "pyrigaud-walks"
POOL_PATH = Path("/var/lib/pyrigaud-test/walks")
DISK_BYTES = 4 * 1024**2
CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256})
CALL_SECONDS = 300

# The depths docs/architecture.md draws ("Describe, walked" and the two after it).
DESCRIBE_DEPTH = 11
EXPORT_DEPTH = 20
IMPORT_DEPTH = 23


@dataclass
class Served:
    stub: pb_grpc.ProviderStub
    application: Application
    channel: grpc.Channel


def _serve(environ: dict[str, str]) -> Served:
    settings = load_settings(
        {
            "PYRIGAUD_LISTEN_ADDRESS": "127.0.0.1",
            "PYRIGAUD_PORT": "0",
            "PYRIGAUD_HEALTH_PORT": "0",
            "PYRIGAUD_STAGING_ALLOW_LOOPBACK": "true",
            "PROVIDER_NAMESPACE": "ns",
            "VIRTRIGAUD_PROVIDER_INSECURE": "true",
            **environ,
        },
        staging_types=STAGING_TYPES,
    )
    application = ok(bootstrap(settings))
    application.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{application.grpc_port}")
    return Served(pb_grpc.ProviderStub(channel), application, channel)


@pytest.fixture(scope="module")
def recorder() -> Iterator[WalkRecorder]:
    """Installed before any provider starts, so every thread they start is profiled."""
    with WalkRecorder().installed() as installed:
        yield installed


@pytest.fixture(scope="module")
def conn() -> Iterator[Any]:
    yield from swept_pool_connection(POOL, POOL_PATH)


@pytest.fixture(scope="module")
def providers(recorder: WalkRecorder, conn: Any) -> Iterator[dict[str, Served]]:
    ensure_dir_pool(conn, POOL, POOL_PATH)
    simulator = shared_simulator()
    vsphere_environ = simulator.serve_environ(
        PROVIDER_DEFAULT_DATASTORE=SIMULATOR_DATASTORE, PROVIDER_NAME="vsphere-walks"
    )
    started: dict[str, Served] = {}
    with pytest.MonkeyPatch.context() as environment:
        for name in ("PYRIGAUD_CREDENTIAL_USERNAME", "PYRIGAUD_CREDENTIAL_PASSWORD"):
            environment.setenv(name, vsphere_environ[name])  # read from the process's environment
        yield from _started(started, vsphere_environ)


def _started(
    started: dict[str, Served], vsphere_environ: dict[str, str]
) -> Iterator[dict[str, Served]]:
    try:
        started["libvirt"] = _serve(
            {
                "PROVIDER_TYPE": "libvirt",
                "PROVIDER_ENDPOINT": QEMU_URI,
                "LIBVIRT_DOMAIN_TYPE": "qemu",
                "PROVIDER_DEFAULT_DATASTORE": POOL,
                "PROVIDER_NAME": "libvirt-walks",
            }
        )
        started["vsphere"] = _serve(vsphere_environ)
        yield started
    finally:
        for served in started.values():
            served.channel.close()
            served.application.stop(0)


def _shown(name: str, walk: Walk) -> None:
    print(f"\n{name}: {walk.depth} frames\n{walk.drawn()}")


def _running_vm(conn: Any, stub: pb_grpc.ProviderStub, name: str) -> str:
    pool = ensure_dir_pool(conn, POOL, POOL_PATH)
    base = pool.createXML(volume_xml(f"{name}-base.raw", DISK_BYTES, volume_format="raw"), 0)
    upload_volume(conn, base, [os.urandom(DISK_BYTES)])
    image_json = json.dumps({"Path": str(base.path()), "Format": "raw"})
    created = stub.Create(
        pb.CreateRequest(name=name, class_json=CLASS_JSON, image_json=image_json),
        timeout=CALL_SECONDS,
    )
    settled(stub, created.task)
    powered = stub.Power(pb.PowerRequest(id=created.id, op=pb.POWER_OP_ON), timeout=120)
    settled(stub, powered.task)
    return str(created.id)


def test_the_three_walks_are_as_deep_as_the_architecture_page_draws_them(
    recorder: WalkRecorder,
    providers: dict[str, Served],
    conn: Any,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    source, target = providers["libvirt"].stub, providers["vsphere"].stub
    vm_id = _running_vm(conn, source, "walks-source")
    made: list[tuple[pb_grpc.ProviderStub, str]] = [(source, vm_id)]
    try:
        # The first Describe reads the VM into the domain cache, the second derives its
        # description from the cache: the manager's every next one, drawn, reads them back.
        for _ in range(2):
            assert source.Describe(pb.DescribeRequest(id=vm_id), timeout=10).exists
        with recorder.recording() as describe:
            described = source.Describe(pb.DescribeRequest(id=vm_id), timeout=10)
        assert described.power_state == "On"

        taken = source.SnapshotCreate(
            pb.SnapshotCreateRequest(vm_id=vm_id, name_hint="walks", include_memory=False),
            timeout=CALL_SECONDS,
        )
        settled(source, taken.task)
        storage = manager_storage("s3", "walks", request, tmp_path)
        with recorder.recording() as export:
            exported = source.ExportDisk(
                pb.ExportDiskRequest(
                    vm_id=vm_id,
                    snapshot_id=taken.snapshot_id,
                    destination_url=storage.url,
                    format="qcow2",
                    **storage.fields(),
                ),
                timeout=TRANSFER_SECONDS,
            )
            settled(source, exported.task)
        assert exported.checksum

        with recorder.recording() as imported_walk:
            imported = target.ImportDisk(
                pb.ImportDiskRequest(
                    source_url=storage.url,
                    format="qcow2",
                    target_name="walks-target-disk",
                    verify_checksum=True,
                    expected_checksum=exported.checksum,
                    **storage.fields(),
                ),
                timeout=TRANSFER_SECONDS,
            )
            settled(target, imported.task)
        assert imported.checksum == exported.checksum
        deleted = source.SnapshotDelete(
            pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=taken.snapshot_id),
            timeout=CALL_SECONDS,
        )
        settled(source, deleted.task)
    finally:
        for stub, made_id in made:
            stub.Delete(pb.DeleteRequest(id=made_id), timeout=120)

    for name, walk in (
        ("Describe", describe),
        ("ExportDisk", export),
        ("ImportDisk", imported_walk),
    ):
        _shown(name, walk)
    assert describe.depth <= DESCRIBE_DEPTH, describe.drawn()
    assert export.depth <= EXPORT_DEPTH, export.drawn()
    assert imported_walk.depth <= IMPORT_DEPTH, imported_walk.drawn()
    for walk in (describe, export, imported_walk):
        assert not walk.rooms_reentered, walk.drawn()
