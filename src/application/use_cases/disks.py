"""ExportDisk / ImportDisk / GetDiskInfo: a disk's move through staging storage, the same on
every hypervisor.

Both first have the storage gate check where the staging store is (a request names the S3
endpoint and the NFS server), pinning the address connections go to, then sweep dead
transfers' temporaries there. ExportDisk reads the disk off the hypervisor (`DiskReading`) into
the staging storage. ImportDisk reads the staged object, has its image judged as it streams
(the format from its first MiB), has the hypervisor hold the bytes (`LandingSite.receive`),
checks the whole image and the SHA-256, and only then makes the disk and keeps the import's
record beside it. Both log their progress, count their bytes and failures (TransferMetrics),
and stop when the caller is gone. Nothing is ever left half-written under a staged object's
name, and nothing is landed from bytes that fail the judge or the checksum.

A retried import (its first answer was lost) of the same staged bytes answers what the record
of the first says, without importing again; other bytes under that name are ALREADY_EXISTS.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.application.ports import CapabilitySource
from pyrigaud.application.ports.disk_transfer import (
    DiskFacts,
    DiskLanding,
    DiskReading,
    DiskStream,
    LandingSite,
    ReceivedDisk,
)
from pyrigaud.application.ports.image_judge import ImageJudge
from pyrigaud.application.ports.staging import StagedReader, StagedWriter, StagingStorage
from pyrigaud.application.ports.storage_gate import StorageGate
from pyrigaud.application.ports.transfer_metrics import (
    TransferMetrics,
    TransferPhase,
    UncountedTransfers,
)
from pyrigaud.application.transfer_progress import TransferProgress
from pyrigaud.application.use_cases.capabilities import require, require_listed
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import name_problem
from pyrigaud.domain.disk_images import JUDGED_PREFIX_BYTES, LandedDisk, peek_header
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import TRANSFER_DEADLINE_SECONDS
from pyrigaud.domain.models import (
    Capabilities,
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
    TransferBackend,
    TransferMode,
)
from pyrigaud.domain.staging import StagedDigest, StagedLocation

# What a staged object's name may end with that is no part of the disk's name.
STAGED_SUFFIXES = (".qcow2", ".raw", ".vmdk", ".img")
# Staged temporaries older than this belong to dead transfers.
ABANDONED_AFTER_SECONDS = 2 * TRANSFER_DEADLINE_SECONDS

_UNCOUNTED = UncountedTransfers()
T = TypeVar("T")

logger = logging.getLogger(__name__)


class ExportDisk:
    def __init__(
        self,
        disks: DiskReading,
        staging: StagingStorage,
        capabilities: CapabilitySource,
        *,
        storage_gate: StorageGate,
        abandoned_after_seconds: float = ABANDONED_AFTER_SECONDS,
        metrics: TransferMetrics = _UNCOUNTED,
    ) -> None:
        self._disks = disks
        self._staging = staging
        self._storage_gate = storage_gate
        self._capabilities = capabilities
        self._abandoned_after_seconds = abandoned_after_seconds
        self._metrics = metrics

    def __call__(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        caps = self._capabilities.capabilities()
        return (
            _carried_mode(request)
            .map(lambda mode: request.model_copy(update={"mode": mode}))
            .bind(lambda request: self._gated(request, caps))
        )

    def _gated(
        self, request: ExportRequest, caps: Capabilities
    ) -> Result[ExportResult, ProviderError]:
        return (
            _claimed(
                request,
                "export",
                supported=caps.supports_disk_export,
                formats=caps.supported_export_formats,
                backends=caps.supported_export_backends,
                modes=caps.supported_transfer_modes,
            )
            .bind(
                lambda _: require(
                    caps.supports_export_compression or not request.compress, "compressed export"
                )
            )
            .bind(lambda _: _checked(request.destination, fields.DESTINATION_URL))
            .bind(self._storage_gate.admitted)
            .bind(
                lambda destination: _Watched(self._metrics, "export", destination).over(
                    lambda watched: self._export(request, destination, watched)
                )
            )
        )

    def _export(
        self, request: ExportRequest, destination: StagedLocation, watched: _Watched
    ) -> Result[ExportResult, ProviderError]:
        opened = self._disks.read_disk(request)
        if isinstance(opened, Failure):
            return opened
        stream = opened.unwrap()
        if stream.left_behind:
            logger.warning(
                "export of VM %r takes one disk: a VM made from it will not have its %s",
                request.vm_id,
                ", ".join(what.value for what in stream.left_behind),
            )
        for what in stream.left_behind:
            self._metrics.left_behind(destination.backend.value, what)
        try:
            _sweep_dead_transfers(self._staging, destination, self._abandoned_after_seconds)
            staged = self._staged(stream, destination, f"export of VM {request.vm_id!r}", watched)
        finally:
            stream.close()
        return staged.map(
            lambda digest: ExportResult(
                export_id=f"export-{digest.sha256[:16]}",  # the same bytes, the same answer
                estimated_size_bytes=digest.size_bytes,
                checksum=digest.sha256,
            )
        )

    def _staged(
        self, stream: DiskStream, destination: StagedLocation, doing: str, watched: _Watched
    ) -> Result[StagedDigest, ProviderError]:
        """Every chunk of `stream` staged and committed; on any failure (a cancelled call
        too) the writer is aborted, so nothing stays staged under a temporary or the name."""
        opened = self._staging.open_write(destination, stream.size_bytes)
        if isinstance(opened, Failure):
            return opened
        writer = opened.unwrap()
        progress = TransferProgress(doing, destination)
        try:
            copied = _copy(stream.read_chunk, writer, progress, watched)
        except BaseException:
            writer.abort()
            raise
        if isinstance(copied, Failure):
            writer.abort()
            return copied
        watched.phase = TransferPhase.COMMIT
        committed = writer.commit()
        if isinstance(committed, Success):
            progress.finished(committed.unwrap())
        return committed


class ImportDisk:
    def __init__(
        self,
        disks: DiskLanding,
        staging: StagingStorage,
        judge: ImageJudge,
        capabilities: CapabilitySource,
        *,
        storage_gate: StorageGate,
        abandoned_after_seconds: float = ABANDONED_AFTER_SECONDS,
        metrics: TransferMetrics = _UNCOUNTED,
    ) -> None:
        self._disks = disks
        self._staging = staging
        self._storage_gate = storage_gate
        self._judge = judge
        self._capabilities = capabilities
        self._abandoned_after_seconds = abandoned_after_seconds
        self._metrics = metrics

    def __call__(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        caps = self._capabilities.capabilities()
        return (
            _carried_mode(request)
            .map(lambda mode: request.model_copy(update={"mode": mode}))
            .bind(lambda request: self._gated(request, caps))
        )

    def _gated(
        self, request: ImportRequest, caps: Capabilities
    ) -> Result[ImportResult, ProviderError]:
        return (
            _claimed(
                request,
                "import",
                supported=caps.supports_disk_import,
                formats=caps.supported_import_formats,
                backends=caps.supported_import_backends,
                modes=caps.supported_transfer_modes,
            )
            .bind(lambda _: _checked(request.source, fields.SOURCE_URL))
            .bind(self._storage_gate.admitted)
            .bind(
                lambda source: _Watched(self._metrics, "import", source).over(
                    lambda watched: self._import(request, source, watched)
                )
            )
        )

    def _import(
        self, request: ImportRequest, source: StagedLocation, watched: _Watched
    ) -> Result[ImportResult, ProviderError]:
        expected = request.expected_checksum if request.verify_checksum else None
        if request.verify_checksum and not request.expected_checksum:
            # What upstream's libvirt, Proxmox and vSphere-over-NFS exports send: no checksum.
            logger.info(
                "import of %r: verify_checksum without an expected_checksum (the export gave "
                "none): nothing is compared; the staged bytes' sha256 is answered",
                source.name,
            )
            expected = None
        found = _imported_stem(request.target_name, source, self._disks.disk_suffix).bind(
            lambda stem: self._disks.landing_site(stem, request.storage_hint)
        )
        if isinstance(found, Failure):
            return found
        site = found.unwrap()
        _sweep_dead_transfers(self._staging, source, self._abandoned_after_seconds)
        opened = self._staging.open_read(source)
        if isinstance(opened, Failure):
            return opened
        reader = opened.unwrap()
        try:
            earlier = site.earlier_record()
            if isinstance(earlier, Failure):
                return earlier
            record = earlier.unwrap()
            if record is not None:
                watched.phase = TransferPhase.VERIFY
                return _answer_again(record, reader, source, expected, site, watched=watched)
            landed = self._land(site, reader, source, expected, watched)
        finally:
            reader.close()
        if isinstance(landed, Failure):
            return landed
        disk, digest = landed.unwrap()
        watched.phase = TransferPhase.COMMIT
        result = ImportResult(
            disk_id=site.disk_name,
            path=disk.path,
            actual_size_bytes=digest.size_bytes,
            checksum=digest.sha256,
        )
        return site.keep_record(_record(result), disk).map(lambda _: result)

    def _land(
        self,
        site: LandingSite,
        reader: StagedReader,
        source: StagedLocation,
        expected: str | None,
        watched: _Watched,
    ) -> Result[tuple[LandedDisk, StagedDigest], ProviderError]:
        """The staged bytes received by the hypervisor, checked, then made the disk; with the
        digest of the staged bytes."""
        held = self._received(site, reader, source, expected, watched)
        if isinstance(held, Failure):
            return held
        received, digest = held.unwrap()
        watched.phase = TransferPhase.COMMIT
        try:
            landed = received.land()
        finally:
            received.discard()
        return landed.map(lambda disk: (disk, digest))

    def _received(
        self,
        site: LandingSite,
        reader: StagedReader,
        source: StagedLocation,
        expected: str | None,
        watched: _Watched,
    ) -> Result[tuple[ReceivedDisk, StagedDigest], ProviderError]:
        """The staged bytes held by the hypervisor once their format is judged and their
        checksum matches; nothing is held otherwise."""
        progress = TransferProgress(f"import of {source.name!r}", source)
        inspection = self._judge.inspect(reader.size_bytes)
        chunks = _StagedChunks(reader, progress, watched, inspection.feed)
        watched.phase = TransferPhase.READ
        _, rest = peek_header(chunks, JUDGED_PREFIX_BYTES)
        cut_short = chunks.failed()
        if cut_short is not None:
            return Failure(cut_short)
        watched.phase = TransferPhase.VERIFY
        first_look = inspection.first_look()
        if isinstance(first_look, Failure):
            return first_look
        watched.phase = TransferPhase.WRITE
        held = site.receive(rest, reader.size_bytes, first_look.unwrap())
        if chunks.failed() is not None:
            watched.phase = TransferPhase.READ
        if isinstance(held, Failure):
            return Failure(chunks.failed() or held.failure())
        received = held.unwrap()
        digest = reader.digest()
        if chunks.failed() is None:
            watched.phase = TransferPhase.VERIFY
        refusal = chunks.failed() or _failure_of(inspection.verdict())
        if refusal is None and expected is not None and digest.sha256 != expected:
            refusal = _checksum_mismatch(digest.sha256, expected)
        if refusal is not None:
            received.discard()
            return Failure(refusal)
        progress.finished(digest)
        return Success((received, digest))


class _Watched:
    """One transfer as its metrics see it: started now, the phase it is in (where a failure
    is counted), its bytes as they pass, and its end."""

    def __init__(self, metrics: TransferMetrics, direction: str, location: StagedLocation) -> None:
        self._metrics = metrics
        self._direction = direction
        self._storage = location.backend.value
        self._started = time.monotonic()
        self._bytes = 0
        self.phase = TransferPhase.OPEN

    def over(
        self, transfer: Callable[[_Watched], Result[T, ProviderError]]
    ) -> Result[T, ProviderError]:
        """`transfer` run and counted; an exception (a bug) counts as failed where it was."""
        self._metrics.started(self._direction, self._storage)
        failed_in: TransferPhase | None = self.phase
        try:
            result = transfer(self)
            failed_in = self.phase if isinstance(result, Failure) else None
            return result
        finally:
            self._metrics.ended(
                self._direction,
                self._storage,
                seconds=time.monotonic() - self._started,
                size_bytes=self._bytes,
                failed_in=failed_in,
            )

    def moved(self, count: int) -> None:
        self._bytes += count
        self._metrics.moved(self._direction, self._storage, count)


class GetDiskInfo:
    def __init__(self, disks: DiskFacts) -> None:
        self._disks = disks

    def __call__(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        return self._disks.disk_details(query)


def _carried_mode(request: ExportRequest | ImportRequest) -> Result[TransferMode, ProviderError]:
    """How the transfer is carried out, by the manager's rules, before what this backend
    supports: a direct transfer through pvc or s3 staging is bad input (only NFS can be reached
    by the hypervisor itself), and a direct one through NFS, which the manager passes on as
    asked (its relay gate exempts NFS), is carried out as relay, as upstream's providers do."""
    if request.mode is not TransferMode.DIRECT:
        return Success(request.mode)
    if request.backend in _RELAY_ONLY_BACKENDS:
        return Failure(
            ProviderError.invalid_spec(
                fields.TRANSFER_MODE,
                f"'direct' cannot be used with backend_type {request.backend.value!r}; "
                "use 'relay' (or 'auto')",
            )
        )
    logger.info("transfer_mode 'direct' through nfs is carried out as relay")
    return Success(TransferMode.RELAY)


_RELAY_ONLY_BACKENDS = frozenset({TransferBackend.PVC, TransferBackend.S3})


def _claimed(
    request: ExportRequest | ImportRequest,
    what: str,
    *,
    supported: bool,
    formats: tuple[str, ...],
    backends: tuple[str, ...],
    modes: tuple[str, ...],
) -> Result[None, ProviderError]:
    """UNSUPPORTED unless the capabilities claim the disk `what` (export, import) with the
    request's format, staging backend and mode: what GetCapabilities told the manager."""
    return (
        require(supported, f"disk {what}")
        .bind(lambda _: require_listed(request.format, formats, "format"))
        .bind(lambda _: require_listed(request.backend.value, backends, f"{what} backend"))
        .bind(lambda _: require_listed(request.mode.value, modes, "transfer mode"))
    )


def _checked(location: StagedLocation | None, field: str) -> Result[StagedLocation, ProviderError]:
    """The location the wire parser checked (it always fills it)."""
    if location is None:
        return Failure(ProviderError.invalid_spec(field, "was not checked"))
    return Success(location)


def _imported_stem(
    target_name: str, source: StagedLocation, disk_suffix: str
) -> Result[str, ProviderError]:
    """The imported disk's name before the hypervisor's `disk_suffix`: `target_name` as given,
    else the staged object's name without its format's suffix."""
    stem = source.name
    for suffix in STAGED_SUFFIXES:
        stem = stem.removesuffix(suffix)
    name = target_name.removesuffix(disk_suffix) if target_name else stem
    problem = name_problem(name)
    if problem is not None:
        return Failure(
            ProviderError.invalid_spec(
                fields.TARGET_NAME, f"{problem} (it names the imported disk)"
            )
        )
    return Success(name)


def _sweep_dead_transfers(
    staging: StagingStorage, location: StagedLocation, older_than_seconds: float
) -> None:
    """Where a transfer goes, the staged temporaries of dead ones go first (the periodic sweep
    cannot reach a bucket or an NFS export it was never told about)."""
    swept = staging.sweep(location, older_than_seconds)
    if isinstance(swept, Failure):
        logger.warning("could not sweep staged leftovers: %s", swept.failure())
    elif swept.unwrap():
        logger.info("removed %d abandoned staged temporaries", swept.unwrap())


def _copy(
    read: Callable[[], Result[bytes, ProviderError]],
    writer: StagedWriter,
    progress: TransferProgress,
    watched: _Watched,
) -> Result[None, ProviderError]:
    """Every chunk `read` gives into `writer`, counted; the first failure stops it."""
    while True:
        watched.phase = TransferPhase.READ
        read_chunk = read()
        if isinstance(read_chunk, Failure):
            return read_chunk
        chunk = read_chunk.unwrap()
        if not chunk:
            return Success(None)
        watched.phase = TransferPhase.WRITE
        written = writer.write(chunk)
        if isinstance(written, Failure):
            return written
        watched.moved(len(chunk))
        counted = progress.add(len(chunk))
        if isinstance(counted, Failure):
            return counted


class _StagedChunks:
    """The staged object's chunks, counted and shown to `inspect`; the first failure (a
    cancelled call too) ends them early and is kept (`failed`), for the import to answer
    instead of the bytes."""

    def __init__(
        self,
        reader: StagedReader,
        progress: TransferProgress,
        watched: _Watched,
        inspect: Callable[[bytes], None] = lambda _: None,
    ) -> None:
        self._reader = reader
        self._progress = progress
        self._watched = watched
        self._inspect = inspect
        self._failure: ProviderError | None = None

    def failed(self) -> ProviderError | None:
        """The failure that ended the chunks early, if one did (asked afresh each time: the
        chunks run on after the first look)."""
        return self._failure

    def __iter__(self) -> Iterator[bytes]:
        while True:
            read = self._reader.read_chunk().bind(
                lambda chunk: self._progress.add(len(chunk)).map(lambda _: chunk)
            )
            if isinstance(read, Failure):
                self._failure = read.failure()
                return
            chunk = read.unwrap()
            if not chunk:
                return
            self._watched.moved(len(chunk))
            self._inspect(chunk)
            yield chunk


def _drained(
    reader: StagedReader, progress: TransferProgress, watched: _Watched
) -> Result[str, ProviderError]:
    """The SHA-256 of the whole staged object, read to its end."""
    chunks = _StagedChunks(reader, progress, watched)
    for _ in chunks:
        pass
    cut_short = chunks.failed()
    if cut_short is not None:
        return Failure(cut_short)
    return Success(reader.digest().sha256)


def _answer_again(
    record: bytes,
    reader: StagedReader,
    source: StagedLocation,
    expected: str | None,
    site: LandingSite,
    *,
    watched: _Watched,
) -> Result[ImportResult, ProviderError]:
    """A retried import (its first answer was lost) of the same staged bytes answers what
    the record says, without importing again; other bytes under that name (even ones that
    would convert to the same disk) are a clash."""
    earlier = _earlier_result(record)
    if earlier is None:
        return Failure(_clash(site))
    if expected is None:
        progress = TransferProgress(f"checksum of {site.disk_name!r}", source)
        drained = _drained(reader, progress, watched)
        if isinstance(drained, Failure):
            return drained
        expected = drained.unwrap()
    return Success(earlier) if earlier.checksum == expected else Failure(_clash(site))


def _failure_of(result: Result[object, ProviderError]) -> ProviderError | None:
    return result.failure() if isinstance(result, Failure) else None


def _clash(site: LandingSite) -> ProviderError:
    return ProviderError.already_exists(
        f"target_name: {site.place} already has an imported disk {site.disk_name!r} with other "
        "content; delete it or pick another target_name"
    )


def _checksum_mismatch(actual: str, expected: str) -> ProviderError:
    """FAILED_PRECONDITION: the staged bytes are not the exported ones; nothing was imported."""
    return ProviderError.failed_precondition(
        f"expected_checksum: the staged object's sha256 is {actual}, not {expected}; "
        "nothing was imported (export the disk again)"
    )


def _record(result: ImportResult) -> bytes:
    """The record kept beside an imported disk (the same bytes every release has kept)."""
    return json.dumps(result.model_dump()).encode()


def _earlier_result(record: bytes) -> ImportResult | None:
    try:
        return ImportResult.model_validate(json.loads(record))
    except ValueError:
        return None
