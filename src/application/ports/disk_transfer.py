"""Disk export/import for migration, and disk facts. Disk bytes never travel over gRPC."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
)


class DiskTransfer(Protocol):
    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]: ...

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]: ...

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]: ...


class TransferLeftovers(Protocol):
    """What transfers killed part-way left in the hypervisor (temporary volumes)."""

    def sweep_transfer_leftovers(
        self, older_than_seconds: float
    ) -> Result[tuple[str, ...], ProviderError]:
        """Remove this provider's leftovers older than `older_than_seconds`; their names."""
        ...
