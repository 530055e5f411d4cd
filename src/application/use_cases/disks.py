"""ExportDisk / ImportDisk / GetDiskInfo, each checked against what the backend supports."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.application.ports import CapabilitySource, DiskTransfer
from pyrigaud.application.use_cases.capabilities import require, require_listed
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
    TransferBackend,
    TransferMode,
)


class ExportDisk:
    def __init__(self, disks: DiskTransfer, capabilities: CapabilitySource) -> None:
        self._disks = disks
        self._capabilities = capabilities

    def __call__(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        caps = self._capabilities.capabilities()
        return (
            _valid_mode(request)
            .bind(lambda _: require(caps.supports_disk_export, "disk export"))
            .bind(lambda _: require_listed(request.format, caps.supported_export_formats, "format"))
            .bind(
                lambda _: require_listed(
                    request.backend.value, caps.supported_export_backends, "export backend"
                )
            )
            .bind(
                lambda _: require_listed(
                    request.mode.value, caps.supported_transfer_modes, "transfer mode"
                )
            )
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
            _valid_mode(request)
            .bind(lambda _: require(caps.supports_disk_import, "disk import"))
            .bind(lambda _: require_listed(request.format, caps.supported_import_formats, "format"))
            .bind(
                lambda _: require_listed(
                    request.backend.value, caps.supported_import_backends, "import backend"
                )
            )
            .bind(
                lambda _: require_listed(
                    request.mode.value, caps.supported_transfer_modes, "transfer mode"
                )
            )
            .bind(lambda _: self._disks.import_disk(request))
        )


def _valid_mode(request: ExportRequest | ImportRequest) -> Result[None, ProviderError]:
    """The manager's rule, checked before what this backend supports: a direct transfer
    through pvc or s3 staging is bad input (only NFS can be reached by the hypervisor)."""
    if request.mode is TransferMode.DIRECT and request.backend in _RELAY_ONLY_BACKENDS:
        return Failure(
            ProviderError.invalid_spec(
                fields.TRANSFER_MODE,
                f"'direct' cannot be used with backend_type {request.backend.value!r}; "
                "use 'relay' (or 'auto')",
            )
        )
    return Success(None)


_RELAY_ONLY_BACKENDS = frozenset({TransferBackend.PVC, TransferBackend.S3})


class GetDiskInfo:
    def __init__(self, disks: DiskTransfer) -> None:
        self._disks = disks

    def __call__(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        return self._disks.disk_details(query)
