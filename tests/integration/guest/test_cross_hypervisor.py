"""The real test guest crosses hypervisors and boots: the manager's VMMigration sequence over
gRPC between a `pyrigaud serve` on libvirtd + QEMU and one on the vSphere simulator.

libvirt -> vSphere through S3 (qcow2 staged, a streamOptimized vmdk landing through an NFC import
lease), then vSphere -> libvirt through a PVC and through NFS (read through an NFC export lease,
staged as qcow2). The disk the final imports hold is byte for byte the guest's (its raw content
compared), and a VM created from it boots on QEMU and prints its ready marker: the bytes survived
two conversions each way.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.guest import READY, console
from support.migration import TRANSFER_SECONDS, Storage, manager_image_json, manager_storage
from support.replica import Replica
from support.vsphere import SIMULATOR_DATASTORE

pytestmark = pytest.mark.timeout(900)

CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256})
BOOT_SECONDS = 120


def _migrate(
    source: pb_grpc.ProviderStub,
    vm_id: str,
    target: pb_grpc.ProviderStub,
    storage: Storage,
    *,
    target_name: str,
    import_format: str,
) -> pb.ImportDiskResponse:
    """GetCapabilities, Power OFF, SnapshotCreate, ExportDisk, ImportDisk, SnapshotDelete: the
    manager's requests, as it sends them (docs/migration.md)."""
    for stub, backends in (
        (source, "supported_export_backends"),
        (target, "supported_import_backends"),
    ):
        caps = stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=10)
        assert storage.backend_type in getattr(caps, backends)
    source.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_OFF), timeout=60)
    snapshot = source.SnapshotCreate(
        pb.SnapshotCreateRequest(vm_id=vm_id, name_hint=f"{target_name}-mig"), timeout=300
    ).snapshot_id
    common = storage.fields()
    started = time.monotonic()
    exported = source.ExportDisk(
        pb.ExportDiskRequest(
            vm_id=vm_id,
            snapshot_id=snapshot,
            destination_url=storage.url,
            format="qcow2",
            **common,
        ),
        timeout=TRANSFER_SECONDS,
    )
    imported = target.ImportDisk(
        pb.ImportDiskRequest(
            source_url=storage.url,
            format=import_format,
            target_name=f"{target_name}-migrated",
            verify_checksum=True,
            expected_checksum=exported.checksum,
            **common,
        ),
        timeout=TRANSFER_SECONDS,
    )
    print(f"{storage.backend_type}: moved in {time.monotonic() - started:.1f} s")
    source.SnapshotDelete(pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=snapshot), timeout=300)
    assert imported.disk_id
    assert imported.checksum == exported.checksum
    return imported


def _create_from(
    stub: pb_grpc.ProviderStub, name: str, imported: pb.ImportDiskResponse, label: str
) -> str:
    """Create with the manager's six-key image_json naming the imported disk's path."""
    image_json = manager_image_json(imported.path, label)
    created = stub.Create(
        pb.CreateRequest(name=name, class_json=CLASS_JSON, image_json=image_json), timeout=300
    )
    return str(created.id)


def _raw_sha256(path: str, scratch: Path) -> str:
    """The SHA-256 of the disk an image file holds (its raw content, whatever its format)."""
    raw = scratch / "disk.raw"
    subprocess.run(
        ["qemu-img", "convert", "-O", "raw", path, str(raw)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    digest = hashlib.sha256(raw.read_bytes()).hexdigest()
    raw.unlink()
    return digest


def test_the_guest_goes_to_vsphere_and_back_and_boots(
    provider: Replica,
    vsphere: Replica,
    conn: Any,
    prepared_image: str,
    migration_root: Path,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    kvm, vs = provider.stub, vsphere.stub
    original = _raw_sha256(prepared_image, tmp_path)
    made: list[tuple[pb_grpc.ProviderStub, str]] = []
    try:
        source = kvm.Create(
            pb.CreateRequest(
                name="cross-src",
                class_json=CLASS_JSON,
                image_json=json.dumps({"Path": prepared_image, "Format": "qcow2"}),
            ),
            timeout=300,
        ).id
        made.append((kvm, source))
        on_vsphere = _migrate(
            kvm,
            source,
            vs,
            manager_storage("s3", "cross-out", request, migration_root),
            target_name="cross-vs",
            import_format="qcow2",
        )
        assert on_vsphere.path.startswith(f"[{SIMULATOR_DATASTORE}] ")
        kvm.Delete(pb.DeleteRequest(id=source), timeout=300)
        made.remove((kvm, source))
        vs_vm = _create_from(vs, "cross-vs", on_vsphere, "vmdk")
        made.append((vs, vs_vm))
        assert vs.Describe(pb.DescribeRequest(id=vs_vm), timeout=10).exists

        for kind in ("pvc", "nfs"):
            storage = manager_storage(kind, f"cross-back-{kind}", request, migration_root)
            back = _migrate(
                vs,
                vs_vm,
                kvm,
                storage,
                target_name=f"cross-back-{storage.backend_type}",
                import_format="qcow2",
            )
            assert _raw_sha256(back.path, tmp_path) == original, storage.backend_type

        booted = _create_from(kvm, "cross-back", back, "qcow2")
        made.append((kvm, booted))
        started = time.monotonic()
        kvm.Power(pb.PowerRequest(id=booted, op=pb.POWER_OP_ON), timeout=120)
        with console(conn, conn.lookupByUUIDString(booted)) as serial:
            ready = serial.wait_for(READY, BOOT_SECONDS)
        print(f"crossed guest ready {time.monotonic() - started:.1f} s after Power ON")
        assert float(ready["uptime"]) > 0
    finally:
        for stub, vm_id in reversed(made):
            stub.Delete(pb.DeleteRequest(id=vm_id), timeout=300)
