"""The real guest migrated through S3 and NFS over gRPC: exported, imported back as a new volume,
and a VM created from the imported `Path` (the manager's six-key image_json) boots and prints its
ready marker."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.guest import READY, console
from support.replica import Replica
from support.staging import NfsServer, S3Server, manager_nfs_options, manager_s3_options

pytestmark = pytest.mark.timeout(600)

CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256})
BOOT_SECONDS = 120
TRANSFER_SECONDS = 1800


def _staging(kind: str, request: pytest.FixtureRequest) -> tuple[str, str, dict[str, str]]:
    """The URL, storage_options_json and credentials the manager sends for `kind`."""
    if kind == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        options, credentials = manager_s3_options(s3)
        return f"s3://{s3.bucket}/vmmigrations/ns/guest/export.vmdk", options, credentials
    nfs: NfsServer = request.getfixturevalue("nfs_server")
    url = f"nfs://{nfs.server}{nfs.export}/vmmigrations-ns-guest-export.qcow2"
    return url, manager_nfs_options(nfs), {}


@pytest.mark.parametrize("kind", ["s3", "nfs"])
def test_the_guest_migrated_through_staging_boots_from_the_imported_path(
    kind: str, provider: Replica, conn: Any, prepared_image: str, request: pytest.FixtureRequest
) -> None:
    url, options, credentials = _staging(kind, request)
    stub = provider.stub
    source = stub.Create(
        pb.CreateRequest(
            name=f"guest-mig-{kind}",
            class_json=CLASS_JSON,
            image_json=json.dumps({"Path": prepared_image, "Format": "qcow2"}),
        ),
        timeout=300,
    ).id
    exported = stub.ExportDisk(
        pb.ExportDiskRequest(
            vm_id=source,
            destination_url=url,
            format="qcow2",
            credentials=credentials,
            backend_type=kind,
            transfer_mode="relay",
            storage_options_json=options,
        ),
        timeout=TRANSFER_SECONDS,
    )
    imported = stub.ImportDisk(
        pb.ImportDiskRequest(
            source_url=url,
            format="qcow2",
            target_name=f"guest-mig-{kind}-target-migrated",
            verify_checksum=True,
            expected_checksum=exported.checksum,
            credentials=credentials,
            backend_type=kind,
            transfer_mode="relay",
            storage_options_json=options,
        ),
        timeout=TRANSFER_SECONDS,
    )
    assert imported.checksum == exported.checksum
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
    target = stub.Create(
        pb.CreateRequest(
            name=f"guest-mig-{kind}-target", class_json=CLASS_JSON, image_json=image_json
        ),
        timeout=300,
    ).id
    try:
        started = time.monotonic()
        stub.Power(pb.PowerRequest(id=target, op=pb.POWER_OP_ON), timeout=120)
        with console(conn, conn.lookupByUUIDString(target)) as serial:
            ready = serial.wait_for(READY, BOOT_SECONDS)
        print(f"migrated guest ({kind}) ready {time.monotonic() - started:.1f} s after Power ON")
        assert float(ready["uptime"]) > 0
    finally:
        for vm_id in (target, source):
            stub.Delete(pb.DeleteRequest(id=vm_id), timeout=300)
