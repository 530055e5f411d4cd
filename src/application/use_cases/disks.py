"""ExportDisk / ImportDisk / GetDiskInfo, each checked against what the backend supports."""

from __future__ import annotations

from returns.result import Result

from pyrigaud.application.ports import CapabilitySource, DiskTransfer
from pyrigaud.application.use_cases.capabilities import require, require_listed
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
    TransferMode,
)


class ExportDisk:
    def __init__(self, disks: DiskTransfer, capabilities: CapabilitySource) -> None:
        self._disks = disks
        self._capabilities = capabilities

    def __call__(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        caps = self._capabilities.capabilities()
        return (
            require(caps.supports_disk_export, "disk export")
            .bind(lambda _: require_listed(request.format, caps.supported_export_formats, "format"))
            .bind(
                lambda _: require_listed(
                    request.backend.value, caps.supported_export_backends, "export backend"
                )
            )
            .bind(lambda _: _mode_supported(request.mode, caps.supported_transfer_modes))
            .bind(
                lambda _: require(
                    caps.supports_export_compression or not request.compress, "compressed export"
                )
            )
            .bind(lambda _: self._disks.export_disk(request))
        )


class ImportDisk:
    def __init__(self, disks: DiskTransfer, capabilities: CapabilitySource) -> None:
        self._disks = disks
        self._capabilities = capabilities

    def __call__(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        caps = self._capabilities.capabilities()
        return (
            require(caps.supports_disk_import, "disk import")
            .bind(lambda _: require_listed(request.format, caps.supported_import_formats, "format"))
            .bind(
                lambda _: require_listed(
                    request.backend.value, caps.supported_import_backends, "import backend"
                )
            )
            .bind(lambda _: _mode_supported(request.mode, caps.supported_transfer_modes))
            .bind(lambda _: self._disks.import_disk(request))
        )


def _mode_supported(mode: TransferMode, supported: tuple[str, ...]) -> Result[None, ProviderError]:
    """ "auto" lets the backend choose, so it is always acceptable."""
    if mode is TransferMode.AUTO:
        return require(True, "")
    return require_listed(mode.value, supported, "transfer mode")


class GetDiskInfo:
    def __init__(self, disks: DiskTransfer) -> None:
        self._disks = disks

    def __call__(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        return self._disks.disk_details(query)
