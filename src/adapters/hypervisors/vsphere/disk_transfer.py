"""DiskTransfer on vSphere: a VM's disk out to staging storage (pvc, s3, nfs) and back in.

The bytes leave vCenter the way its own export tools take them, through an NFC export lease
(`nfc_export.py`: one streamOptimized vmdk per disk, whatever the datastore's layout), and enter
it through an NFC import lease (`disk_import.py`: a transient one-disk VM, unregistered once the
disk landed). Between vCenter's streamOptimized vmdk and the staged qcow2, raw or vmdk the
conversion is done here in the pod, chunk by chunk (`pyrigaud.adapters.disk_images`), never by a
forked program. Two steps need a seekable file: reading a qcow2 (its tables may follow the data
they map) and writing one (its tables precede the data); those use anonymous scratch files in
PYRIGAUD_TRANSFER_SCRATCH_DIR (unlinked from the start: a killed provider leaves nothing).

Export of a running VM is refused unless it names a snapshot (the manager's sequence powers the
VM off and takes one); the state at a snapshot is read through the snapshot's own export lease.
An import checks the staged bytes' SHA-256 before anything lands in vCenter, and leaves a small
record of it next to the disk, so that a retried import answers the same without a second disk.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

from returns.result import Result

from pyrigaud.adapters.disk_images.formats import disk_format_of, peek_header
from pyrigaud.adapters.disk_images.qcow2 import qcow2_virtual_size, read_qcow2, write_qcow2
from pyrigaud.adapters.disk_images.scratch import file_chunks, scratch_file, spool
from pyrigaud.adapters.disk_images.stream_optimized import (
    decode_stream_optimized,
    encode_stream_optimized,
    is_stream_optimized,
    stream_optimized_capacity,
)
from pyrigaud.adapters.hypervisors.vsphere import datastore_files
from pyrigaud.adapters.hypervisors.vsphere.disk_import import import_stream_optimized
from pyrigaud.adapters.hypervisors.vsphere.errors import run
from pyrigaud.adapters.hypervisors.vsphere.nfc_export import exported_disk
from pyrigaud.adapters.hypervisors.vsphere.placement import import_location
from pyrigaud.adapters.hypervisors.vsphere.snapshots import find_snapshot
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import (
    ImportMarks,
    power_state,
    virtual_disks,
)
from pyrigaud.adapters.staging.progress import TransferProgress
from pyrigaud.adapters.staging.transfers import (
    RECORD_SUFFIX,
    answer_again,
    checked_location,
    checksum_mismatch,
    counted,
    expected_sha256,
    import_record,
    imported_name,
    staged_chunks,
    sweep_dead_transfers,
    unwrap,
    write_staged,
)
from pyrigaud.application.ports.staging import StagedReader, StagingBackends
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.leftovers import TRANSFER_DEADLINE_SECONDS
from pyrigaud.domain.models import (
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
    Placement,
)
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.staging import StagedDigest, StagedLocation

EXPORT_FORMATS = ("vmdk", "qcow2", "raw")
IMPORT_FORMATS = ("vmdk", "qcow2", "raw")  # what the staged bytes may be, judged by their header
HEADER_BYTES = 512


class VSphereDiskTransfer:
    """ExportDisk, ImportDisk and the facts of one disk."""

    def __init__(
        self,
        vcenter: VCenter,
        staging: StagingBackends,
        defaults: Placement,
        marks: ImportMarks,
        *,
        scratch_dir: str | None = None,
        abandoned_after_seconds: float = 2 * TRANSFER_DEADLINE_SECONDS,
    ) -> None:
        self._vcenter = vcenter
        self._staging = staging
        self._defaults = defaults
        self._marks = marks
        self._scratch_dir = scratch_dir
        self._abandoned_after_seconds = abandoned_after_seconds

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        """The disk asked for (the first when none is named); a linked clone's names the
        snapshot disk it grows from as its backing file."""

        def read(instance: Any) -> DiskDetails:
            row = self._vcenter.vm_row(instance, query.vm_id, ("config.hardware.device",))
            if row is None:
                raise ExpectedError(ProviderError.vm_not_found(query.vm_id))
            disks = virtual_disks(row)
            index = _disk_index(disks, query.disk_id, query.vm_id)
            disk = disks[index]
            parent = getattr(disk.backing, "parent", None)
            return DiskDetails(
                disk_id=str(disk.key),
                format="vmdk",
                path=str(disk.backing.fileName),
                virtual_size_bytes=int(disk.capacityInKB) * 1024,
                is_bootable=index == 0,
                backing_file=str(parent.fileName) if parent is not None else "",
            )

        return run(self._vcenter.session, f"reading disks of VM {query.vm_id!r}", read)

    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        return run(
            self._vcenter.session,
            f"exporting a disk of VM {request.vm_id!r}",
            lambda instance: self._export(instance, request),
        )

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        return run(
            self._vcenter.session,
            "importing a disk",  # the URL is not echoed before it is checked
            lambda instance: self._import(instance, request),
        )

    def _export(self, instance: Any, request: ExportRequest) -> ExportResult:
        destination = checked_location(request.destination, fields.DESTINATION_URL)
        if request.format not in EXPORT_FORMATS:
            raise ExpectedError(
                ProviderError.unsupported(
                    f"format {request.format!r}: vSphere exports {', '.join(EXPORT_FORMATS)}"
                )
            )
        row = self._vcenter.vm_row(
            instance, request.vm_id, ("name", "runtime.powerState", "config.hardware.device")
        )
        if row is None:
            raise ExpectedError(ProviderError.vm_not_found(request.vm_id))
        name = str(row.get("name") or request.vm_id)
        index = _disk_index(virtual_disks(row), request.disk_id, name)
        if request.snapshot_id:
            source = find_snapshot(self._vcenter, instance, request.vm_id, request.snapshot_id)
        elif power_state(row) != PowerState.OFF:
            raise ExpectedError(
                ProviderError.failed_precondition(
                    f"VM {name!r} is running (its disk is changing): power it off, or export "
                    "from a snapshot (snapshot_id)"
                )
            )
        else:
            source = row["_ref"]
        sweep_dead_transfers(self._staging, destination, self._abandoned_after_seconds)
        doing = f"export of VM {name!r}"
        with exported_disk(instance, source, index) as disk:
            vmdk = disk.chunks()
            if request.format == "vmdk":
                digest = self._staged(destination, vmdk, disk.size_bytes, doing)
            elif request.format == "raw":
                header, vmdk = peek_header(vmdk, HEADER_BYTES)
                raw = decode_stream_optimized(vmdk)
                size = stream_optimized_capacity(header)
                digest = self._staged(destination, raw, size, doing)
            else:
                digest = self._staged_qcow2(destination, vmdk, doing)
        return ExportResult(
            export_id=f"export-{digest.sha256[:16]}",  # the same bytes, the same answer
            estimated_size_bytes=digest.size_bytes,
            checksum=digest.sha256,
        )

    def _staged(
        self, destination: StagedLocation, chunks: Iterable[bytes], size: int | None, doing: str
    ) -> StagedDigest:
        progress = TransferProgress(doing, destination)
        writer = unwrap(self._staging.open_write(destination, size))
        digest = write_staged(writer, chunks, progress)
        progress.finished(digest)
        return digest

    def _staged_qcow2(
        self, destination: StagedLocation, vmdk: Iterator[bytes], doing: str
    ) -> StagedDigest:
        """qcow2's tables come before its data: the image is built in a scratch file first."""
        reading = TransferProgress(f"{doing}, reading from vCenter", destination)
        header, vmdk = peek_header(counted(vmdk, reading), HEADER_BYTES)
        with scratch_file(self._scratch_dir) as scratch:
            size = write_qcow2(
                decode_stream_optimized(vmdk), stream_optimized_capacity(header), scratch
            )
            scratch.seek(0)
            return self._staged(destination, file_chunks(scratch), size, doing)

    def _import(self, instance: Any, request: ImportRequest) -> ImportResult:
        source = checked_location(request.source, fields.SOURCE_URL)
        expected = expected_sha256(request)
        name = imported_name(request.target_name, source, ".vmdk")
        location = import_location(instance, self._defaults, request.storage_hint)
        datastore = str(location.datastore.name)
        record_path = f"[{datastore}] {name}/{name}{RECORD_SUFFIX}"
        transient = self._vcenter.record(instance, name)
        if transient is not None:
            self._marks.refuse_unfinished(transient, "an import of the disk")
        sweep_dead_transfers(self._staging, source, self._abandoned_after_seconds)
        reader = unwrap(self._staging.open_read(source))
        try:
            earlier = self._earlier_record(instance, record_path, f"[{datastore}] {name}")
            if earlier is not None:
                return answer_again(
                    earlier,
                    reader,
                    source,
                    expected=expected,
                    name=name,
                    place=f"datastore {datastore!r}",
                )
            with scratch_file(self._scratch_dir) as vmdk:
                capacity, digest = self._stream_optimized(reader, source, vmdk)
                if expected is not None and digest.sha256 != expected:
                    raise checksum_mismatch(digest.sha256, expected)
                size = vmdk.tell()
                vmdk.seek(0)
                path = import_stream_optimized(
                    instance, vmdk, size, name, location, capacity, marks=self._marks.building()
                )
        finally:
            reader.close()
        result = ImportResult(
            disk_id=name, path=path, actual_size_bytes=digest.size_bytes, checksum=digest.sha256
        )
        try:
            datastore_files.write_small(instance, record_path, import_record(result))
        except BaseException:
            datastore_files.delete(instance, f"[{datastore}] {name}")  # this import's own
            raise
        return result

    def _stream_optimized(
        self, reader: StagedReader, source: StagedLocation, vmdk: IO[bytes]
    ) -> tuple[int, StagedDigest]:
        """The staged disk as a streamOptimized vmdk in `vmdk`; its capacity and the digest of
        the staged bytes (all of them read)."""
        progress = TransferProgress(f"import of {source.name!r}", source)
        header, chunks = peek_header(staged_chunks(reader, progress), HEADER_BYTES)
        staged_format = disk_format_of(header)
        if staged_format == "vmdk":
            if not is_stream_optimized(header):
                raise ExpectedError(
                    ProviderError.invalid_spec(
                        fields.SOURCE_URL,
                        "the staged vmdk is not streamOptimized; stage a streamOptimized vmdk, "
                        "a qcow2 or a raw image",
                    )
                )
            capacity = stream_optimized_capacity(header)
            spool(chunks, vmdk)
        elif staged_format == "raw":
            capacity = reader.size_bytes if reader.size_bytes is not None else 0
            if reader.size_bytes is None:
                raise ExpectedError(
                    ProviderError.invalid_spec(
                        fields.SOURCE_URL, "the staging storage does not tell the raw image's size"
                    )
                )
            spool(encode_stream_optimized(chunks, capacity), vmdk)
        else:
            capacity = qcow2_virtual_size(header)
            with scratch_file(self._scratch_dir) as qcow2:
                spool(chunks, qcow2)
                qcow2.seek(0)
                spool(encode_stream_optimized(read_qcow2(qcow2), capacity), vmdk)
        digest = reader.digest()
        progress.finished(digest)
        return capacity, digest

    def _earlier_record(self, instance: Any, record_path: str, folder: str) -> bytes | None:
        """The record of an earlier import under this name whose disk is still there; the
        record of a disk deleted since (with the VM made around it) goes with its folder."""
        record = datastore_files.read_small(instance, record_path)
        if record is None:
            return None
        try:
            path = str(json.loads(record)["path"])
        except (ValueError, KeyError, TypeError):
            return record  # not ours to judge: a clash below
        if datastore_files.exists(instance, path):
            return record
        datastore_files.delete(instance, folder)
        return None


def _disk_index(disks: list[Any], disk_id: str, vm: str) -> int:
    """The position of the disk named by device key (the first when none is named)."""
    for index, disk in enumerate(disks):
        if not disk_id or str(disk.key) == disk_id:
            return index
    missing = f"no disk {disk_id!r}" if disk_id else "no disks"
    raise ExpectedError(ProviderError.not_found(f"VM {vm!r} has {missing}"))
