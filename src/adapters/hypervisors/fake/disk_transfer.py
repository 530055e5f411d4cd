"""DiskTransfer on the fake hypervisor: exports and imports answer as a host would, staging a
few bytes standing for the disk in memory (by URL), so checksums, their verification, retries
and name clashes behave as on a real backend; an imported disk is attached to nothing
(it becomes a base image a Create can name)."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass

from returns.result import Result

from pyrigaud.adapters.hypervisors.fake.hypervisor import (
    DISK_DIR,
    FakeDisk,
    FakeHypervisor,
    FakeImage,
)
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.models import (
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
)

GIB = 1024**3
IMPORTED_DISK_GIB = 1


@dataclass(frozen=True)
class FakeDiskTransfer:
    hypervisor: FakeHypervisor

    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        def export() -> ExportResult:
            disk = self._disk(request.vm_id, request.disk_id, request.snapshot_id)
            content = f"{disk.id}:{disk.size_gib}:{request.snapshot_id}:{request.format}".encode()
            self.hypervisor.staged[request.destination_url] = content
            checksum = hashlib.sha256(content).hexdigest()
            return ExportResult(
                export_id=f"export-{checksum[:16]}",
                estimated_size_bytes=disk.size_gib * GIB,
                checksum=checksum,
            )

        return self.hypervisor.serve("export_disk", export)

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        def import_() -> ImportResult:
            content = self.hypervisor.staged.get(request.source_url)
            if content is None:
                raise _not_found(f"no staged object at {request.source_url}")
            checksum = hashlib.sha256(content).hexdigest()
            if request.verify_checksum and checksum != request.expected_checksum:
                raise ExpectedError(
                    ProviderError.failed_precondition(
                        f"expected_checksum: the staged object's sha256 is {checksum}"
                    )
                )
            name = request.target_name or f"imported-{self.hypervisor.next_serial()}"
            if self.hypervisor.imported.setdefault(name, checksum) != checksum:
                raise ExpectedError(
                    ProviderError.already_exists(f"target_name: {name!r} has other content")
                )
            path = f"{DISK_DIR}/{name}.qcow2"
            # the imported disk is a base a Create can name as its image path
            self.hypervisor.images.setdefault(
                path, FakeImage(id=name, path=path, size_gib=IMPORTED_DISK_GIB)
            )
            return ImportResult(
                disk_id=name,
                path=path,
                actual_size_bytes=IMPORTED_DISK_GIB * GIB,
                checksum=checksum,
            )

        return self.hypervisor.serve("import_disk", import_)

    def sweep_transfer_leftovers(
        self, older_than_seconds: float
    ) -> Result[tuple[str, ...], ProviderError]:
        """No bytes move here, so no transfer leaves anything behind."""
        del older_than_seconds
        return self.hypervisor.serve("sweep_transfer_leftovers", tuple)

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        def details() -> DiskDetails:
            disk = self._disk(query.vm_id, query.disk_id, query.snapshot_id)
            vm = self.hypervisor.vms[query.vm_id]
            return DiskDetails(
                disk_id=disk.id,
                format=disk.format,
                virtual_size_bytes=disk.size_gib * GIB,
                actual_size_bytes=disk.size_gib * GIB // 10,
                path=disk.path,
                is_bootable=disk.id == vm.disks[0].id,
                snapshots=tuple(vm.snapshots),
                backing_file=disk.backing_file,
                metadata={"vm": vm.name},
            )

        return self.hypervisor.serve("disk_details", details)

    def _disk(self, vm_id: str, disk_id: str, snapshot_id: str) -> FakeDisk:
        """A copy of the VM's disk by id or path (the root disk when none is named)."""
        vm = self.hypervisor.vm(vm_id)
        if snapshot_id and snapshot_id not in vm.snapshots:
            raise _not_found(f"VM {vm.name!r} has no snapshot {snapshot_id!r}")
        if not disk_id:
            if not vm.disks:
                raise _not_found(f"VM {vm.name!r} has no disks")
            return copy.copy(vm.disks[0])
        for disk in vm.disks:
            if disk_id in (disk.id, disk.path):
                return copy.copy(disk)
        raise _not_found(f"VM {vm.name!r} has no disk {disk_id!r}")


def _not_found(message: str) -> ExpectedError:
    return ExpectedError(ProviderError.not_found(message))
