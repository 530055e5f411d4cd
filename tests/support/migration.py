"""What the VirtRigaud manager sends for a VMMigration (docs/migration.md), for the tests that walk
its sequence over gRPC: the staging URL, options and credentials it derives from spec.storage,
the image_json of the target VM's Create, and its polling of the tasks the provider returns."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.staging import NfsServer, S3Server, manager_nfs_options, manager_s3_options

NAMESPACE = "ns"  # the migration's namespace
PVC = "mig-pvc"  # status.storagePVCName: mounted by every provider pod under the storage root
S3_PREFIX = "lab"
TRANSFER_SECONDS = 1800  # the manager's deadline for ExportDisk and ImportDisk
TASK_SECONDS = 120  # how long a test lets a task it polls run


@dataclass(frozen=True)
class Storage:
    """What the manager derives from spec.storage: type, URL, options JSON and credentials."""

    backend_type: str
    url: str
    options_json: str = ""
    credentials: dict[str, str] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The fields ExportDisk and ImportDisk share."""
        return {
            "credentials": self.credentials,
            "backend_type": self.backend_type,
            "transfer_mode": "relay",  # what the manager sends for spec mode auto or empty
            "storage_options_json": self.options_json,
        }


def manager_storage(
    kind: str, migration: str, request: pytest.FixtureRequest, storage_root: Path
) -> Storage:
    """The staging of migration `ns/<migration>` on `kind` (pvc, s3 or nfs), with the URL
    generateStorageURL builds; S3 and NFS are the session's `s3_server` and `nfs_server`, the
    PVC a folder of `storage_root` (the providers' PYRIGAUD_MIGRATION_STORAGE_ROOT)."""
    if kind == "pvc":
        (storage_root / PVC).mkdir(parents=True, exist_ok=True)
        return Storage("pvc", f"pvc://{PVC}/vmmigrations/{NAMESPACE}/{migration}/export.qcow2")
    if kind == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        options, credentials = manager_s3_options(s3, prefix=S3_PREFIX)
        key = f"{S3_PREFIX}/vmmigrations/{NAMESPACE}/{migration}/export.vmdk"  # always .vmdk
        return Storage("s3", f"s3://{s3.bucket}/{key}", options, credentials)
    assert kind == "nfs", kind
    nfs: NfsServer = request.getfixturevalue("nfs_server")
    url = f"nfs://{nfs.server}{nfs.export}/vmmigrations-{NAMESPACE}-{migration}-export.qcow2"
    return Storage("nfs", url, manager_nfs_options(nfs))


def manager_image_json(path: str, disk_format: str) -> str:
    """Create's image_json for a VM around an imported disk: contracts.VMImage as the VM
    controller marshals it, all six keys (its Go fields have no tags)."""
    return json.dumps(
        {
            "TemplateName": "",
            "Path": path,
            "URL": "",
            "Format": disk_format,
            "Checksum": "",
            "ChecksumType": "sha256",
        }
    )


def settled(stub: pb_grpc.ProviderStub, task: pb.TaskRef) -> None:
    """Poll a task (if any) through TaskStatus until done, as the manager does; a task that
    ends in an error fails the test."""
    if not task.id:
        return
    deadline = time.monotonic() + TASK_SECONDS
    while time.monotonic() < deadline:
        status = stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=10)
        if status.done:
            assert not status.error, f"task {task.id} failed: {status.error}"
            return
        time.sleep(0.2)
    raise AssertionError(f"task {task.id} not done in {TASK_SECONDS} s")
