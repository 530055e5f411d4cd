"""ImportDisk: a staged disk landed on the hypervisor (`DiskLanding`). Behind the storage gate,
it reads the staged object, has its image judged as it streams (the format from its first MiB),
has the hypervisor hold the bytes (`LandingSite.receive`), checks the whole image and the
SHA-256, and only then makes the disk and keeps the import's record beside it; counted, logged,
stopped when the caller is gone. Nothing is landed from bytes that fail the judge or the
checksum.

A retried import (its first answer was lost) of the same staged bytes answers what the record
of the first says, without importing again; other bytes under that name are ALREADY_EXISTS.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

from returns.result import Failure, Result, Success

from pyrigaud.application.ports import CapabilitySource
from pyrigaud.application.ports.disk_transfer import DiskLanding, LandingSite, ReceivedDisk
from pyrigaud.application.ports.image_judge import ImageJudge
from pyrigaud.application.ports.staging import StagedReader, StagingStorage
from pyrigaud.application.ports.storage_gate import StorageGate
from pyrigaud.application.ports.transfer_metrics import TransferMetrics, TransferPhase
from pyrigaud.application.transfer_progress import TransferProgress
from pyrigaud.application.use_cases.transfers import (
    ABANDONED_AFTER_SECONDS,
    UNCOUNTED,
    Watched,
    carried,
    checked,
    claimed,
    sweep_dead_transfers,
)
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import name_problem
from pyrigaud.domain.disk_images import JUDGED_PREFIX_BYTES, LandedDisk, peek_header
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Capabilities, ImportRequest, ImportResult
from pyrigaud.domain.staging import StagedDigest, StagedLocation

# What a staged object's name may end with that is no part of the disk's name.
STAGED_SUFFIXES = (".qcow2", ".raw", ".vmdk", ".img")

logger = logging.getLogger(__name__)


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
        metrics: TransferMetrics = UNCOUNTED,
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
        return carried(request, lambda request: self._gated(request, caps))

    def _gated(
        self, request: ImportRequest, caps: Capabilities
    ) -> Result[ImportResult, ProviderError]:
        return (
            claimed(
                request,
                "import",
                supported=caps.supports_disk_import,
                formats=caps.supported_import_formats,
                backends=caps.supported_import_backends,
                modes=caps.supported_transfer_modes,
            )
            .bind(lambda _: checked(request.source, fields.SOURCE_URL))
            .bind(self._storage_gate.admitted)
            .bind(
                lambda source: Watched(self._metrics, "import", source).over(
                    lambda watched: self._import(request, source, watched)
                )
            )
        )

    def _import(
        self, request: ImportRequest, source: StagedLocation, watched: Watched
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
        sweep_dead_transfers(self._staging, source, self._abandoned_after_seconds)
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
        watched: Watched,
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
        watched: Watched,
    ) -> Result[tuple[ReceivedDisk, StagedDigest], ProviderError]:
        """The staged bytes held by the hypervisor once their format is judged and their
        checksum matches; nothing is held otherwise."""
        progress = TransferProgress(f"import of {source.name!r}", source)
        inspection = self._judge.inspect(reader.size_bytes, fields.SOURCE_URL)
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


class _StagedChunks:
    """The staged object's chunks, counted and shown to `inspect`; the first failure (a
    cancelled call too) ends them early and is kept (`failed`), for the import to answer
    instead of the bytes."""

    def __init__(
        self,
        reader: StagedReader,
        progress: TransferProgress,
        watched: Watched,
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
    reader: StagedReader, progress: TransferProgress, watched: Watched
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
    watched: Watched,
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
