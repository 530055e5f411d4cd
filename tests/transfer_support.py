"""ExportDisk / ImportDisk requests as the manager sends them, read by the wire parsers (which
check the staged location once), then handed to a backend's DiskTransfer port."""

from __future__ import annotations

import json
from collections.abc import Mapping

from returns.result import Result

from pyrigaud.application.ports import DiskTransfer
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import ExportResult, ImportResult
from pyrigaud.entrypoints.grpc.wire import parse_export, parse_import


def export_disk(
    port: DiskTransfer | None,
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
) -> Result[ExportResult, ProviderError]:
    assert port is not None
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
    ).bind(port.export_disk)


def import_disk(
    port: DiskTransfer | None,
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
    assert port is not None
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
    ).bind(port.import_disk)
