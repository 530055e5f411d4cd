"""ExportDisk: a VM's disk read off the hypervisor (`DiskReading`) at a point in time into the
staging storage, behind the storage gate, counted, logged and stopped when the caller is gone.
Nothing is ever left half-written under the staged object's name.

Beside the staged disk goes its hardware manifest (`application/hardware_manifest.py`): what
the VM's guest boots on, read off the hypervisor (`HardwareFacts`), so that the VM made from
the disk elsewhere gets hardware its guest has drivers for. It is written once the disk is
committed (it names the disk's checksum), and a manifest that cannot be made is a warning,
never a failed export: an import without one is what upstream's exports give anyway."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from returns.result import Failure, Result, Success

from pyrigaud.application.hardware_manifest import MANIFEST_SUFFIX
from pyrigaud.application.hardware_manifest import render as render_manifest
from pyrigaud.application.ports import CapabilitySource
from pyrigaud.application.ports.disk_transfer import DiskReading, DiskStream
from pyrigaud.application.ports.staging import StagedFile, StagedWriter
from pyrigaud.application.ports.transfer_metrics import TransferPhase
from pyrigaud.application.ports.virtual_hardware import HardwareFacts
from pyrigaud.application.transfer_progress import TransferProgress
from pyrigaud.application.use_cases.capabilities import require
from pyrigaud.application.use_cases.transfers import (
    TransferContext,
    Watched,
    claimed,
)
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import VirtualHardware
from pyrigaud.domain.models import DiskRead, ExportRequest, ExportResult
from pyrigaud.domain.staging import StagedDigest, StagedLocation

logger = logging.getLogger(__name__)


class ExportDisk:
    def __init__(
        self,
        disks: DiskReading,
        capabilities: CapabilitySource,
        transfers: TransferContext,
        *,
        hardware: HardwareFacts | None = None,
    ) -> None:
        self._disks = disks
        self._hardware = hardware
        self._capabilities = capabilities
        self._transfers = transfers
        self._staging = transfers.staging

    def __call__(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        match self._transfers.admitted(request, self._claimed):
            case Failure() as failed:
                return failed
            case Success((ExportRequest() as carried_request, StagedLocation() as destination)):
                pass
        with self._transfers.watched("export", destination) as watched:
            return watched.counted(self._export(carried_request, destination, watched))

    def _claimed(self, request: ExportRequest) -> Result[None, ProviderError]:
        """The export as it is carried out, claimed by the capabilities (compression too)."""
        caps = self._capabilities.capabilities()
        return Result.do(
            None
            for _ in claimed(request, caps)
            for _ in require(
                caps.supports_export_compression or not request.compress, "compressed export"
            )
        )

    def _export(
        self, request: ExportRequest, destination: StagedLocation, watched: Watched
    ) -> Result[ExportResult, ProviderError]:
        doing = f"export of VM {request.vm_id!r}"
        disk = DiskRead(
            vm_id=request.vm_id,
            disk_id=request.disk_id,
            snapshot_id=request.snapshot_id or None,
            format=request.format,
        )
        reading = TransferProgress(
            f"{doing}, reading the disk", destination, self._transfers.clock, announced=False
        )
        match self._disks.read_disk(disk, reading):
            case Failure() as failed:
                return failed
            case Success(stream):
                pass
        if stream.left_behind:
            logger.warning(
                "export of VM %r takes one disk: a VM made from it will not have its %s",
                request.vm_id,
                ", ".join(what.value for what in stream.left_behind),
            )
        for what in stream.left_behind:
            self._transfers.metrics.left_behind(destination.staging_type, what)
        hardware = self._guest_hardware(request)
        try:
            self._transfers.sweep(destination)
            staged = self._staged(stream, destination, doing, watched)
        finally:
            stream.close()
        match staged:
            case Success(digest) if hardware is not None:
                self._stage_manifest(destination, hardware, digest)
        return staged.map(_exported)

    def _guest_hardware(self, request: ExportRequest) -> VirtualHardware | None:
        """What the VM's guest boots on, for its manifest; None (and a warning) when the
        hypervisor cannot tell."""
        if self._hardware is None:
            return None
        read = self._hardware.hardware_of(request.vm_id, request.disk_id)
        match read:
            case Success(VirtualHardware() as hardware):
                return hardware
            case Failure(error):
                logger.warning(
                    "export of VM %r: no hardware manifest, its hardware could not be read: %s",
                    request.vm_id,
                    error.message,
                )
        return None

    def _stage_manifest(
        self, destination: StagedLocation, hardware: VirtualHardware, digest: StagedDigest
    ) -> None:
        """The manifest beside the committed disk, bound to its checksum."""
        manifest = render_manifest(hardware, digest.sha256)
        beside = destination.companion(MANIFEST_SUFFIX)
        written = Result.do(
            committed
            for writer in self._staging.open_write(beside, len(manifest))
            for _ in writer.write(manifest)
            for committed in writer.commit()
        )
        match written:
            case Success(_):
                logger.info("staged the hardware manifest %s", beside.url)
            case Failure(error):
                logger.warning(
                    "the hardware manifest beside %s could not be staged (a VM made from the "
                    "disk gets the target's devices unless its disk says otherwise): %s",
                    destination.url,
                    error.message,
                )

    def _staged(
        self, stream: DiskStream, destination: StagedLocation, doing: str, watched: Watched
    ) -> Result[StagedDigest, ProviderError]:
        """Every byte of `stream` staged and committed: an image made whole first is made in
        the store's own file where it keeps one, else in scratch and copied like any other."""
        progress = TransferProgress(doing, destination, watched.clock)
        if stream.made_whole_first:
            match self._staging.open_file(destination):
                case Failure() as failed:
                    return failed
                case Success(None):
                    pass
                case Success(staged) if staged is not None:
                    watched.phase = TransferPhase.WRITE
                    match _committed(staged, partial(stream.make, staged.file), progress, watched):
                        case Success(digest):  # its bytes counted once they are all there
                            watched.moved(digest.size_bytes)
                            return Success(digest)
                        case Failure() as failed:
                            return failed
            watched.phase = TransferPhase.READ
            match stream.make(None):  # in scratch first: its size then plans the store's write
                case Failure() as failed:
                    return failed
        match self._staging.open_write(destination, stream.size_bytes):
            case Failure() as failed:
                return failed
            case Success(writer):
                pass
        return _committed(
            writer, partial(_copy, stream.read_chunk, writer, progress, watched), progress, watched
        )


def _exported(digest: StagedDigest) -> ExportResult:
    return ExportResult(
        export_id=f"export-{digest.sha256[:16]}",  # the same bytes, the same answer
        estimated_size_bytes=digest.size_bytes,
        checksum=digest.sha256,
    )


def _committed(
    staged: StagedWriter | StagedFile,
    fill: Callable[[], Result[None, ProviderError]],
    progress: TransferProgress,
    watched: Watched,
) -> Result[StagedDigest, ProviderError]:
    """`staged` filled and committed; on any failure (a cancelled call too) it is aborted, so
    nothing stays staged under a temporary or the name."""
    try:
        filled = fill()
    except BaseException:
        staged.abort()
        raise
    match filled:
        case Failure() as failed:
            staged.abort()
            return failed
    watched.phase = TransferPhase.COMMIT
    match staged.commit():
        case Failure() as failed:
            return failed
        case Success(digest):
            progress.finished(digest)
    return Success(digest)


def _copy(
    read: Callable[[], Result[bytes, ProviderError]],
    writer: StagedWriter,
    progress: TransferProgress,
    watched: Watched,
) -> Result[None, ProviderError]:
    """Every chunk `read` gives into `writer`, counted; the first failure stops it."""
    while True:
        watched.phase = TransferPhase.READ
        match read():
            case Failure() as failed:
                return failed
            case Success(b""):
                return Success(None)
            case Success(chunk):
                pass
        watched.phase = TransferPhase.WRITE
        match writer.write(chunk):
            case Failure() as failed:
                return failed
        watched.moved(len(chunk))
        match progress.add(len(chunk)):
            case Failure() as failed:
                return failed
