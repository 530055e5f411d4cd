"""ExportDisk / ImportDisk requests read by the wire parsers: the staged location is checked
once there, and every refusal names the wire field or key the manager filled."""

from __future__ import annotations

import json
from typing import Any

import pytest
from returns.result import Result

from pyrigaud.adapters.staging.nfs_location import NfsOptions
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.adapters.staging.s3_location import S3, S3Options
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import ExportRequest, ImportRequest
from pyrigaud.entrypoints.grpc.wire import parse_export, parse_import
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

from support import error_of, ok

S3_OPTIONS = {
    "backend": "s3",
    "bucket": "mig",
    "endpoint": "http://10.0.0.9:9000",
    "region": "us-east-1",
    "prefix": "lab",
    "usePathStyle": True,
}
S3_CREDENTIALS = {"accessKeyID": "AKIA", "secretAccessKey": "do-not-echo"}
NFS_OPTIONS = {
    "backend": "nfs",
    "usePathStyle": False,
    "server": "10.0.0.5",
    "export": "/export/migrations",
    "path": "vr",
    "uid": 1000,
    "gid": 1000,
}


def _export(
    url: str, backend: str, options: object, credentials: dict[str, str]
) -> Result[ExportRequest, ProviderError]:
    return parse_export(
        vm_id="vm",
        disk_id="",
        snapshot_id="",
        destination_url=url,
        disk_format="qcow2",
        compress=False,
        credentials=credentials,
        backend_type=backend,
        transfer_mode="relay",
        storage_options_json=options if isinstance(options, str) else json.dumps(options),
        staging_types=STAGING_TYPES,
    )


def _import(
    url: str, backend: str, options: object, **changes: object
) -> Result[ImportRequest, ProviderError]:
    fields: dict[str, Any] = {
        "source_url": url,
        "storage_hint": "",
        "disk_format": "qcow2",
        "target_name": "web-migrated",
        "verify_checksum": True,
        "expected_checksum": "A" * 64,
        "credentials": {},
        "backend_type": backend,
        "transfer_mode": "relay",
        "storage_options_json": options if isinstance(options, str) else json.dumps(options),
        "staging_types": STAGING_TYPES,
    }
    fields.update(changes)
    return parse_import(**fields)


def test_the_managers_s3_export_carries_its_checked_location() -> None:
    url = "s3://mig/lab/vmmigrations/ns/m/export.vmdk"
    request = ok(_export(url, "s3", S3_OPTIONS, S3_CREDENTIALS))

    location = request.destination
    assert location is not None
    assert (location.staging_type, location.container, location.key) == (
        S3,
        "mig",
        "lab/vmmigrations/ns/m/export.vmdk",
    )
    assert isinstance(location.options, S3Options)
    assert location.options.endpoint == "http://10.0.0.9:9000"
    assert "do-not-echo" not in repr(request)


def test_the_managers_nfs_import_carries_its_identity_and_a_bare_checksum() -> None:
    url = "nfs://10.0.0.5/export/migrations/vr/vmmigrations-ns-m-export.qcow2?gid=7&uid=8"
    request = ok(_import(url, "nfs", NFS_OPTIONS, expected_checksum="sha256:" + "A" * 64))

    assert request.source is not None
    assert request.source.key == "vr/vmmigrations-ns-m-export.qcow2"
    assert isinstance(request.source.options, NfsOptions)
    assert (request.source.options.uid, request.source.options.gid) == (8, 7)
    assert request.expected_checksum == "a" * 64


def test_an_empty_pvc_options_string_is_the_managers_pvc_shape() -> None:
    request = ok(_export("pvc://mig/vmmigrations/ns/m/export.qcow2", "", "", {}))

    assert request.destination is not None
    assert request.destination.container == "mig"


@pytest.mark.parametrize(
    ("url", "backend", "options", "credentials", "named"),
    [
        ("s3://mig/x.vmdk", "s3", S3_OPTIONS, {"secretAccessKey": "s"}, "credentials.accessKeyID"),
        (
            "s3://mig/x.vmdk",
            "s3",
            {**S3_OPTIONS, "bucket": ""},
            S3_CREDENTIALS,
            "storage_options_json.bucket",
        ),
        (
            "s3://mig/x.vmdk",
            "s3",
            {**S3_OPTIONS, "usePathStyle": 3},
            S3_CREDENTIALS,
            "storage_options_json.usePathStyle",
        ),
        (
            "s3://mig/x.vmdk",
            "s3",
            {**S3_OPTIONS, "region": 3},
            S3_CREDENTIALS,
            "storage_options_json.region",
        ),
        ("nfs://10.0.0.5/other/x", "nfs", NFS_OPTIONS, {}, "destination_url"),
        (
            "nfs://10.0.0.5/export/migrations/x",
            "nfs",
            {**NFS_OPTIONS, "uid": -1},
            {},
            "storage_options_json.uid",
        ),
        ("pvc://mig/x", "s3", S3_OPTIONS, S3_CREDENTIALS, "destination_url"),
        ("", "pvc", "", {}, "destination_url"),
        ("pvc://mig/x", "pvc", "[1]", {}, "storage_options_json"),
        ("pvc://mig/x", "ftp", "", {}, "backend_type"),
    ],
)
def test_a_bad_location_is_refused_naming_the_wire_field(
    url: str, backend: str, options: object, credentials: dict[str, str], named: str
) -> None:
    refused = error_of(_export(url, backend, options, credentials))

    assert refused.kind is ErrorKind.INVALID_SPEC
    on_the_wire = for_the_manager(refused)
    assert on_the_wire.startswith(named)
    assert "do-not-echo" not in on_the_wire


def test_a_malformed_expected_checksum_is_refused() -> None:
    refused = error_of(_import("pvc://mig/x", "pvc", "", expected_checksum="md5:00"))

    assert refused.kind is ErrorKind.INVALID_SPEC
    assert "expected_checksum" in refused.message


def test_verify_checksum_without_an_expected_one_is_read_as_sent() -> None:
    """Upstream's libvirt, Proxmox and vSphere-over-NFS exports return no checksum; the
    manager then asks to verify with an empty one (the import answers the staged checksum)."""
    request = ok(_import("pvc://mig/x.qcow2", "pvc", "", expected_checksum=""))

    assert request.verify_checksum
    assert request.expected_checksum == ""
