"""DiskTransfer on vSphere: GetDiskInfo from the VM's devices; disk export and import are not
implemented (capabilities say so)."""

from __future__ import annotations

from typing import Any

from returns.result import Failure, Result

from pyrigaud.adapters.hypervisors.vsphere.errors import run
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import virtual_disks
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.models import (
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
)


class VSphereDiskTransfer:
    def __init__(self, vcenter: VCenter) -> None:
        self._vcenter = vcenter

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        """The disk asked for (the first when none is named); a linked clone's names the
        snapshot disk it grows from as its backing file."""

        def read(instance: Any) -> DiskDetails:
            row = self._vcenter.vm_row(instance, query.vm_id, ("config.hardware.device",))
            if row is None:
                raise ExpectedError(ProviderError.vm_not_found(query.vm_id))
            disks = virtual_disks(row)
            wanted = [d for d in disks if not query.disk_id or str(d.key) == query.disk_id]
            if not wanted:
                raise ExpectedError(ProviderError.not_found(f"disk {query.disk_id!r} not found"))
            disk = wanted[0]
            parent = getattr(disk.backing, "parent", None)
            return DiskDetails(
                disk_id=str(disk.key),
                format="vmdk",
                path=str(disk.backing.fileName),
                virtual_size_bytes=int(disk.capacityInKB) * 1024,
                is_bootable=disk is disks[0],
                backing_file=str(parent.fileName) if parent is not None else "",
            )

        return run(self._vcenter.session, f"reading disks of VM {query.vm_id!r}", read)

    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        return Failure(ProviderError.unsupported("disk export is not implemented for vSphere"))

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        return Failure(ProviderError.unsupported("disk import is not implemented for vSphere"))
