"""The manager's VMMigration walked over gRPC between two `pyrigaud serve` processes (source and
target provider) on one libvirtd, for each staging backend: exactly the requests the manager
sends (docs/migration.md), staged on a PVC folder, moto's S3 server or nfs-ganesha on loopback."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.adapters.hypervisors.libvirt.storage import upload_volume, volume_facts, volume_xml
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from e2e_support import create_vm
from qemu_support import (
    EVERYTHING_OF_THE_DOMAIN,
    QEMU_URI,
    ensure_dir_pool,
    open_qemu,
    remove_pool_leftovers,
)
from replica_support import Replica
from staging_support import NfsServer, S3Server, manager_nfs_options, manager_s3_options

POOL = "pyrigaud-walk"
POOL_PATH = Path("/var/lib/pyrigaud-test/walk")
BASE_BYTES = 8 * 1024**2
TRANSFER_SECONDS = 1800  # the manager's deadline for ExportDisk and ImportDisk


@dataclass(frozen=True)
class Storage:
    """What the manager derives from spec.storage: type, URL, options JSON and credentials."""

    backend_type: str
    url: str
    options_json: str
    credentials: dict[str, str]


def _storage(kind: str, request: pytest.FixtureRequest, root: Path) -> Storage:
    migration = f"walk-{kind}"
    if kind == "pvc":
        (root / "mig-pvc").mkdir(parents=True)
        url = f"pvc://mig-pvc/vmmigrations/ns/{migration}/export.qcow2"
        return Storage("pvc", url, "", {})
    if kind == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        options, credentials = manager_s3_options(s3, prefix="lab")
        url = f"s3://{s3.bucket}/lab/vmmigrations/ns/{migration}/export.vmdk"
        return Storage("s3", url, options, credentials)
    nfs: NfsServer = request.getfixturevalue("nfs_server")
    url = f"nfs://{nfs.server}{nfs.export}/vmmigrations-ns-{migration}-export.qcow2"
    return Storage("nfs", url, manager_nfs_options(nfs), {})


@pytest.fixture
def conn() -> Iterator[Any]:
    connection = open_qemu()
    remove_pool_leftovers(connection, POOL, POOL_PATH)
    yield connection
    remove_pool_leftovers(connection, POOL, POOL_PATH)
    connection.close()


def _provider(name: str, root: Path, home: Path) -> Replica:
    return Replica(
        {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": QEMU_URI,
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PROVIDER_DEFAULT_DATASTORE": POOL,
            "PROVIDER_NAMESPACE": "ns",
            "PROVIDER_NAME": name,
            "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(root),
        },
        home,
    )


@pytest.mark.parametrize("kind", ["pvc", "s3", "nfs"])
def test_the_managers_migration_sequence_moves_a_vm_between_two_providers(
    kind: str, conn: Any, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    root = tmp_path / "migration-storage"  # the PVC both provider pods mount
    storage = _storage(kind, request, root)
    content = os.urandom(BASE_BYTES)
    pool = ensure_dir_pool(conn, POOL, POOL_PATH)
    base = pool.createXML(volume_xml("walk-base.raw", BASE_BYTES, volume_format="raw"), 0)
    upload_volume(conn, base, [content])
    source = _provider("source", root, tmp_path / "source")
    target = _provider("target", root, tmp_path / "target")
    try:
        for provider in (source, target):  # the Validating phase's gate
            caps = provider.stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=10)
            assert kind in caps.supported_export_backends
            assert kind in caps.supported_import_backends
            assert list(caps.supported_transfer_modes) == ["relay"]
        image = json.dumps({"Path": str(base.path()), "Format": "raw"})
        vm_id = create_vm(source.stub, f"walk-{kind}", image_json=image)
        source.stub.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_OFF), timeout=60)

        exported = source.stub.ExportDisk(
            pb.ExportDiskRequest(
                vm_id=vm_id,
                disk_id="",
                destination_url=storage.url,
                format="qcow2",
                compress=False,
                credentials=storage.credentials,
                backend_type=storage.backend_type,
                transfer_mode="relay",
                storage_options_json=storage.options_json,
            ),
            timeout=TRANSFER_SECONDS,
        )
        assert exported.export_id
        assert len(exported.checksum) == 64

        target_name = f"walk-{kind}-target"
        imported = target.stub.ImportDisk(
            pb.ImportDiskRequest(
                source_url=storage.url,
                storage_hint="",
                format="qcow2",  # pvc: diskFormat; s3 from a libvirt source: qcow2; nfs: qcow2
                target_name=f"{target_name}-migrated",
                verify_checksum=True,
                expected_checksum=exported.checksum,
                credentials=storage.credentials,
                backend_type=storage.backend_type,
                transfer_mode="relay",
                storage_options_json=storage.options_json,
            ),
            timeout=TRANSFER_SECONDS,
        )
        assert imported.disk_id
        assert imported.checksum == exported.checksum
        landed = volume_facts(conn, imported.path)
        assert landed is not None
        assert (landed.format, landed.capacity_bytes) == ("qcow2", BASE_BYTES)

        image_json = json.dumps(
            {
                "TemplateName": "",
                "Path": imported.path,
                "URL": "",
                "Format": "qcow2",
                "Checksum": "",
                "ChecksumType": "sha256",
            }
        )
        migrated = create_vm(target.stub, target_name, image_json=image_json)
        described = target.stub.Describe(pb.DescribeRequest(id=migrated), timeout=10)
        assert described.exists
        disk = target.stub.GetDiskInfo(pb.GetDiskInfoRequest(vm_id=migrated), timeout=120)
        assert imported.path in (disk.path, disk.backing_file)  # the imported volume, or under it

        back = source.stub.ExportDisk(  # the migrated VM's disk holds the source's bytes
            pb.ExportDiskRequest(
                vm_id=vm_id,
                destination_url=storage.url.replace("export.", "again."),
                format="raw",
                credentials=storage.credentials,
                backend_type=storage.backend_type,
                transfer_mode="relay",
                storage_options_json=storage.options_json,
            ),
            timeout=TRANSFER_SECONDS,
        )
        moved = target.stub.ExportDisk(
            pb.ExportDiskRequest(
                vm_id=migrated,
                destination_url=storage.url.replace("export.", "moved."),
                format="raw",
                credentials=storage.credentials,
                backend_type=storage.backend_type,
                transfer_mode="relay",
                storage_options_json=storage.options_json,
            ),
            timeout=TRANSFER_SECONDS,
        )
        assert moved.checksum == back.checksum
    finally:
        assert source.stop() == 0
        assert target.stop() == 0
        for dom in conn.listAllDomains(0):
            if dom.name().startswith(f"walk-{kind}"):
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(EVERYTHING_OF_THE_DOMAIN)
