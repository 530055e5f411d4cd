"""ExportDisk / ImportDisk requests as the manager sends them, read by the wire parsers (which
check the staged location once), then handed to the use cases as the container wires them over
a backend's disk ports and a staging storage."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack
from urllib.parse import urlsplit

from returns.result import Result

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.disk_images.inspection import InspectingJudge
from pyrigaud.adapters.staging.gate import ResolvingGate
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.registry import STAGING_TYPES, StagingTypes
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import CapabilitySource
from pyrigaud.application.ports.staging import StagingStorage
from pyrigaud.application.ports.storage_gate import StorageGate
from pyrigaud.application.use_cases.capabilities import TransferClaims
from pyrigaud.application.use_cases.export_disk import ExportDisk
from pyrigaud.application.use_cases.import_disk import ImportDisk
from pyrigaud.application.use_cases.transfers import TransferContext
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
    StagingType,
)
from pyrigaud.domain.staging import StagedLocation
from pyrigaud.domain.staging_gate import StagingGate
from pyrigaud.entrypoints.grpc.wire import parse_export, parse_import
from pyrigaud.entrypoints.settings import load_settings

TRANSFER_OWNER = "tests/pyrigaud"  # the owner mark of the staged temporaries tests make
# The staged image judge as `pyrigaud serve` makes it by default.
IMAGE_JUDGE = InspectingJudge(
    load_settings({}, staging_types=STAGING_TYPES).max_image_virtual_bytes
)
# The storage gate with the tests' stores on loopback allowed (PYRIGAUD_STAGING_ALLOW_LOOPBACK).
LOOPBACK_GATE = ResolvingGate(StagingGate(allow_loopback=True))
# How long the tests' staging waits out a store that does not answer: the stores the tests
# start answer at once, and an unreachable one is refused in a second (the outage tests set
# their own budget).
STAGING_RETRY_SECONDS = 1.0
# Where this machine can stage disks (S3 needs boto3, NFS libnfs): what backends advertise.
REACHABLE_STAGING = STAGING_TYPES.stores(TRANSFER_OWNER, SystemClock()).types


@dataclass(frozen=True)
class DiskMoves:
    """ExportDisk and ImportDisk, or anything that answers as they do (a gRPC-backed pair)."""

    export_disk: Callable[[ExportRequest], Result[ExportResult, ProviderError]]
    import_disk: Callable[[ImportRequest], Result[ImportResult, ProviderError]]


def disk_moves(
    backend: Backend,
    staging: StagingStorage | Path,
    owner: str = TRANSFER_OWNER,
    capabilities: CapabilitySource | None = None,
    storage_gate: StorageGate | None = None,
) -> DiskMoves:
    """The backend's disk transfer use cases through `staging` (a staging storage, or the PVC
    root one is built over), as the backend's capabilities allow (or `capabilities`'), with
    the staging types this machine reaches claimed as the container claims the built ones,
    behind `storage_gate` (default: the tests' stores on loopback allowed)."""
    disks = backend.disk_transfer
    assert disks is not None, "this backend has no disk transfer"
    if isinstance(staging, Path):
        staging = STAGING_TYPES.stores(
            owner, SystemClock(), str(staging), retry_seconds=STAGING_RETRY_SECONDS
        )
    claimed = TransferClaims(capabilities or backend.capabilities, REACHABLE_STAGING)
    gate = storage_gate or LOOPBACK_GATE
    return DiskMoves(
        export_disk=ExportDisk(
            disks, claimed, TransferContext(staging, gate, SystemClock()), hardware=backend.hardware
        ),
        import_disk=ImportDisk(
            disks, IMAGE_JUDGE, claimed, TransferContext(staging, gate, SystemClock())
        ),
    )


class ExportFields(TypedDict, total=False):
    """What an ExportDisk request may say beyond its VM and URL (`export_request`'s keywords)."""

    backend: str
    disk_format: str
    options: Mapping[str, object] | None
    credentials: Mapping[str, str] | None
    snapshot_id: str
    disk_id: str
    transfer_mode: str


def export_disk(
    moves: DiskMoves, vm_id: str, destination_url: str, **request: Unpack[ExportFields]
) -> Result[ExportResult, ProviderError]:
    return export_request(vm_id, destination_url, **request).bind(moves.export_disk)


def export_request(
    vm_id: str,
    destination_url: str,
    *,
    backend: str = "pvc",
    disk_format: str = "qcow2",
    options: Mapping[str, object] | None = None,
    credentials: Mapping[str, str] | None = None,
    snapshot_id: str = "",
    disk_id: str = "",
    transfer_mode: str = "relay",
    staging_types: StagingTypes = STAGING_TYPES,
) -> Result[ExportRequest, ProviderError]:
    """An ExportDisk request as the wire parses the manager's."""
    return parse_export(
        vm_id=vm_id,
        disk_id=disk_id,
        snapshot_id=snapshot_id,
        destination_url=destination_url,
        disk_format=disk_format,
        compress=False,
        credentials=dict(credentials or {}),
        backend_type=backend,
        transfer_mode=transfer_mode,
        storage_options_json=json.dumps(options) if options else "",
        staging_types=staging_types,
    )


def import_disk(
    moves: DiskMoves,
    source_url: str,
    *,
    target_name: str = "",
    backend: str = "pvc",
    disk_format: str = "qcow2",
    expected_checksum: str = "",
    verify_checksum: bool | None = None,
    options: Mapping[str, object] | None = None,
    credentials: Mapping[str, str] | None = None,
    storage_hint: str = "",
) -> Result[ImportResult, ProviderError]:
    """`verify_checksum` defaults to whether an expected checksum is given."""
    return parse_import(
        source_url=source_url,
        storage_hint=storage_hint,
        disk_format=disk_format,
        target_name=target_name,
        verify_checksum=bool(expected_checksum) if verify_checksum is None else verify_checksum,
        expected_checksum=expected_checksum,
        credentials=dict(credentials or {}),
        backend_type=backend,
        transfer_mode="relay",
        storage_options_json=json.dumps(options) if options else "",
        staging_types=STAGING_TYPES,
    ).bind(moves.import_disk)


def staged(
    url: str, staging_type: StagingType = PVC, field: str = fields.DESTINATION_URL
) -> StagedLocation:
    """A location as if the wire parser had checked `url` (its host the container, its path
    the key), for a request made by hand that a use case refuses before staging anything."""
    parts = urlsplit(url)
    return StagedLocation(
        staging_type=staging_type,
        field=field,
        url=url,
        container=parts.netloc,
        key=parts.path.lstrip("/"),
    )
