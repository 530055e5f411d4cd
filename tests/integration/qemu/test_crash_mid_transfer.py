"""`pyrigaud serve` killed with SIGKILL in the middle of an ExportDisk and of an ImportDisk on
real libvirtd + QEMU, staging on a PVC folder, an S3 bucket or an NFS export: the temporaries
the dead transfers leave (a flattened export volume, a staged `.part` file or S3 upload, a
staged import volume) carry the provider's mark and start time, nothing is left under a final
name, and the next process's start-up sweep removes them all (S3 and NFS: from the places it
is configured with)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.storage import volume_xml
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.e2e import create_vm
from support.qemu import EVERYTHING_OF_THE_DOMAIN, QEMU_URI, ensure_dir_pool, open_qemu
from support.replica import Replica
from support.staging import manager_nfs_options, manager_s3_options

POOL = "pyrigaud-crash-xfer"
POOL_PATH = Path("/var/lib/pyrigaud-test/crash-xfer")
DISK_BYTES = 2 * 1024**3  # sparse: long enough to stream that the kill lands mid-way
KILL_AFTER_BYTES = 32 * 1024**2
VM_NAME = "crash-xfer-vm"
SWEEP_SECONDS = 60
ENVIRON = {
    "PROVIDER_TYPE": "libvirt",
    "PROVIDER_ENDPOINT": QEMU_URI,
    "LIBVIRT_DOMAIN_TYPE": "qemu",
    "PROVIDER_DEFAULT_DATASTORE": POOL,
    "PROVIDER_NAMESPACE": "ns",
    "PROVIDER_NAME": "crash-xfer",
}


@pytest.fixture
def conn() -> Iterator[Any]:
    connection = open_qemu()
    _remove_leftovers(connection)
    yield connection
    _remove_leftovers(connection)
    connection.close()


def test_transfers_killed_part_way_are_swept_by_the_next_process(conn: Any, tmp_path: Path) -> None:
    root = tmp_path / "migration-storage"
    pvc = root / "mig"
    pvc.mkdir(parents=True)
    environ = {**ENVIRON, "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(root)}
    pool = ensure_dir_pool(conn, POOL, POOL_PATH)
    base = pool.createXML(volume_xml("crash-base.raw", DISK_BYTES, volume_format="raw"), 0)

    exporter = Replica(environ, tmp_path / "exporter")
    image = f'{{"Path": "{base.path()}", "Format": "raw"}}'
    vm_id = create_vm(exporter.stub, VM_NAME, image_json=image)
    disks = _volume_names(conn)
    export = pb.ExportDiskRequest(
        vm_id=vm_id,
        destination_url="pvc://mig/vmmigrations/ns/m/export.raw",
        format="raw",  # the VM's disk is a qcow2 overlay: flattened into a temporary volume
        backend_type="pvc",
        transfer_mode="relay",
    )
    _killed_during(exporter, lambda: exporter.stub.ExportDisk(export, timeout=600), pvc_grew(pvc))
    staged = [p.name for p in (pvc / "vmmigrations" / "ns" / "m").iterdir()]
    assert all(name.startswith(".export.raw.ns%2Fcrash-xfer.") for name in staged), staged
    assert staged, "the export was killed before it staged anything"
    assert any(name.startswith("xfer.ns%2Fcrash-xfer.") for name in _volume_names(conn) - disks)

    (pvc / "big.raw").write_bytes(b"")
    os.truncate(pvc / "big.raw", DISK_BYTES)
    importer = Replica(environ, tmp_path / "importer")
    imported = _pvc_import("big.raw", "raw", "crash-xfer-imported")
    _killed_during(
        importer, lambda: importer.stub.ImportDisk(imported, timeout=600), pool_grew(conn)
    )
    leftovers = _volume_names(conn) - disks
    assert "crash-xfer-imported.qcow2" not in leftovers, "a partial volume under the final name"
    assert any(".import." in name for name in leftovers), leftovers

    survivor = Replica(
        {**environ, "PYRIGAUD_TRANSFER_ABANDONED_AFTER_SECONDS": "0"}, tmp_path / "survivor"
    )
    try:
        assert survivor.logged("removed the temporary volume of a dead transfer", SWEEP_SECONDS)
        assert _volume_names(conn) == disks
        assert [p.name for p in (pvc / "vmmigrations" / "ns" / "m").iterdir()] == []
        assert sorted(p.name for p in pvc.iterdir()) == ["big.raw", "vmmigrations"]
    finally:
        survivor.stop()


def test_an_import_killed_while_written_in_place_is_unavailable_until_swept(
    conn: Any, tmp_path: Path
) -> None:
    """A plain qcow2 is written under its disk's final name, its landing mark made first: a
    kill part-way leaves the partial disk and the mark. Another process answers an import of
    the name UNAVAILABLE (never the partial disk as a finished one, never a clash), and the
    sweep of a process that counts it abandoned removes both, after which the import works."""
    root = tmp_path / "migration-storage"
    pvc = root / "mig"
    pvc.mkdir(parents=True)
    staged = pvc / "whole.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(staged), "1G"], check=True)
    subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 512M", str(staged)],
        check=True,
        capture_output=True,
    )
    environ = {**ENVIRON, "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(root)}
    ensure_dir_pool(conn, POOL, POOL_PATH)
    disks = _volume_names(conn)
    imported = _pvc_import("whole.qcow2", "qcow2", "crash-xfer-in-place")
    importer = Replica(environ, tmp_path / "importer")
    disk = POOL_PATH / "crash-xfer-in-place.qcow2"
    _killed_during(
        importer,
        lambda: importer.stub.ImportDisk(imported, timeout=600),
        lambda: disk.exists() and disk.stat().st_blocks * 512 > KILL_AFTER_BYTES,
    )
    left = _volume_names(conn) - disks
    assert left == {"crash-xfer-in-place.qcow2", "crash-xfer-in-place.qcow2.pyrigaud-landing.json"}
    assert disk.stat().st_blocks * 512 < staged.stat().st_size, "the kill came after the upload"

    retrier = Replica(environ, tmp_path / "retrier")
    try:
        with pytest.raises(grpc.RpcError) as unfinished:
            retrier.stub.ImportDisk(imported, timeout=60)
        assert unfinished.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "has not finished" in str(unfinished.value.details())
        assert _volume_names(conn) - disks == left
    finally:
        retrier.stop()

    survivor = Replica(
        {**environ, "PYRIGAUD_TRANSFER_ABANDONED_AFTER_SECONDS": "0"}, tmp_path / "survivor"
    )
    try:
        assert survivor.logged("removed the temporary volume of a dead transfer", SWEEP_SECONDS)
        assert _volume_names(conn) == disks
        landed = survivor.stub.ImportDisk(imported, timeout=600)
        assert landed.disk_id == "crash-xfer-in-place.qcow2"
        assert disk.read_bytes() == staged.read_bytes()
    finally:
        survivor.stop()


@pytest.mark.parametrize("backend", ["s3", "nfs"])
def test_exports_killed_part_way_to_s3_and_nfs_are_swept_from_the_configured_places(
    backend: str, conn: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Where no PVC is mounted, the next process finds what a dead export staged through the
    places it is configured with: an S3 multipart upload (and its marker), an NFS `.part`."""
    pool = ensure_dir_pool(conn, POOL, POOL_PATH)
    base = pool.createXML(volume_xml("crash-base.raw", DISK_BYTES, volume_format="raw"), 0)
    environ = {**ENVIRON, "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(tmp_path / "no-pvcs")}
    exporter = Replica(environ, tmp_path / "exporter")
    image = f'{{"Path": "{base.path()}", "Format": "raw"}}'
    vm_id = create_vm(exporter.stub, VM_NAME, image_json=image)
    disks = _volume_names(conn)
    place: dict[str, object]
    if backend == "s3":
        server = request.getfixturevalue("s3_server")
        options, credentials = manager_s3_options(server, prefix="crash")
        url = f"s3://{server.bucket}/crash/vmmigrations/ns/{vm_id}/export.vmdk"
        secret = tmp_path / "secret"
        secret.mkdir()
        for key, value in credentials.items():
            (secret / key).write_text(value)
        place = {"credentialsDir": str(secret)}
        staged, grew = s3_leftovers(
            server.client(), server.bucket, f"crash/vmmigrations/ns/{vm_id}/"
        )
    else:
        nfs = request.getfixturevalue("nfs_server")
        options, credentials = manager_nfs_options(nfs), {}
        url = f"nfs://{nfs.server}{nfs.export}/vmmigrations-ns-{vm_id}-export.raw"
        place = {}
        staged, grew = nfs_leftovers(nfs.export, f".vmmigrations-ns-{vm_id}-export.raw.")
    export = pb.ExportDiskRequest(
        vm_id=vm_id,
        destination_url=url,
        format="raw",
        backend_type=backend,
        transfer_mode="relay",
        storage_options_json=options,
        credentials=credentials,
    )
    _killed_during(exporter, lambda: exporter.stub.ExportDisk(export, timeout=600), grew)
    assert staged(), "the export was killed before it staged anything"

    place.update({"backendType": backend, "storageOptions": json.loads(options)})
    survivor = Replica(
        {
            **environ,
            "PYRIGAUD_TRANSFER_ABANDONED_AFTER_SECONDS": "0",
            "PYRIGAUD_STAGING_SWEEP_PLACES": json.dumps([place]),
        },
        tmp_path / "survivor",
    )
    try:
        assert survivor.logged("staged temporaries of dead transfers", SWEEP_SECONDS)
        assert survivor.logged("removed the temporary volume of a dead transfer", SWEEP_SECONDS)
        assert staged() == []
        assert _volume_names(conn) == disks
    finally:
        survivor.stop()


def s3_leftovers(
    client: Any, bucket: str, folder: str
) -> tuple[Callable[[], list[str]], Callable[[], bool]]:
    """What is staged in the folder (uploads in progress, markers, objects), and whether an
    upload there has sent a part."""

    def staged() -> list[str]:
        uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=folder).get("Uploads", [])
        objects = client.list_objects_v2(Bucket=bucket, Prefix=folder).get("Contents", [])
        return [f"upload {u['Key']}" for u in uploads] + [o["Key"] for o in objects]

    def grew() -> bool:
        uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=folder).get("Uploads", [])
        return any(
            client.list_parts(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"]).get("Parts")
            for u in uploads
        )

    return staged, grew


def nfs_leftovers(export: Path, prefix: str) -> tuple[Callable[[], list[str]], Callable[[], bool]]:
    def staged() -> list[str]:
        return sorted(name for name in os.listdir(export) if name.startswith(prefix))

    def grew() -> bool:
        return any((export / name).stat().st_size > KILL_AFTER_BYTES for name in staged())

    return staged, grew


def pvc_grew(pvc: Path) -> Callable[[], bool]:
    def grew() -> bool:
        folder = pvc / "vmmigrations" / "ns" / "m"
        return folder.is_dir() and any(
            p.stat().st_size > KILL_AFTER_BYTES for p in folder.iterdir()
        )

    return grew


def pool_grew(conn: Any) -> Callable[[], bool]:
    def grew() -> bool:
        return any(
            ".import." in p.name and p.stat().st_blocks * 512 > KILL_AFTER_BYTES
            for p in POOL_PATH.iterdir()
        )

    return grew


def _pvc_import(staged: str, disk_format: str, target_name: str) -> pb.ImportDiskRequest:
    """The manager's ImportDisk of `staged` in the test's PVC `mig`."""
    return pb.ImportDiskRequest(
        source_url=f"pvc://mig/{staged}",
        format=disk_format,
        target_name=target_name,
        backend_type="pvc",
        transfer_mode="relay",
    )


def _killed_during(replica: Replica, call: Callable[[], object], ready: Callable[[], bool]) -> None:
    """Run `call` and SIGKILL the replica as soon as `ready()` holds."""
    killed = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ready():
            time.sleep(0.01)
        os.kill(replica.pid, signal.SIGKILL)
        killed.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with pytest.raises(grpc.RpcError):  # the process dies under the call
        call()
    assert killed.wait(130)
    replica.kill()


def _volume_names(conn: Any) -> set[str]:
    """The pool's volumes, once libvirtd has ended the stream jobs of a killed client."""
    pool = conn.storagePoolLookupByName(POOL)
    deadline = time.monotonic() + 30
    while True:
        try:
            pool.refresh(0)
            break
        except libvirt.libvirtError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return {str(volume.name()) for volume in pool.listAllVolumes(0)}


def _remove_leftovers(conn: Any) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        dom = conn.lookupByName(VM_NAME)
        if dom.isActive():
            dom.destroy()
        dom.undefineFlags(EVERYTHING_OF_THE_DOMAIN)
    for volume in ensure_dir_pool(conn, POOL, POOL_PATH).listAllVolumes(0):
        volume.delete(0)


def test_a_transfer_whose_client_gave_up_stops_and_leaves_nothing(
    conn: Any, tmp_path: Path
) -> None:
    root = tmp_path / "migration-storage"
    pvc = root / "mig"
    pvc.mkdir(parents=True)
    (pvc / "big.raw").write_bytes(b"")
    os.truncate(pvc / "big.raw", DISK_BYTES)
    provider = Replica(
        {**ENVIRON, "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(root)}, tmp_path / "provider"
    )
    try:
        before = _volume_names(conn)
        imported = _pvc_import("big.raw", "raw", "crash-xfer-abandoned")
        with pytest.raises(grpc.RpcError) as gave_up:
            provider.stub.ImportDisk(imported, timeout=0.5)  # well before 2 GiB can move
        assert gave_up.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED

        assert provider.logged("the client cancelled or its deadline passed", 30)
        assert _volume_names(conn) == before
    finally:
        assert provider.stop() == 0
