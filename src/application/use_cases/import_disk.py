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

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from returns.result import Failure, Result, Success

from pyrigaud.application.hardware_manifest import MANIFEST_SUFFIX, MAX_MANIFEST_BYTES
from pyrigaud.application.hardware_manifest import read as read_manifest
from pyrigaud.application.import_record import ImportRecord, parse_record, render_record
from pyrigaud.application.ports import CapabilitySource
from pyrigaud.application.ports.disk_transfer import DiskLanding, LandingSite, ReceivedDisk
from pyrigaud.application.ports.image_judge import ImageJudge
from pyrigaud.application.ports.staging import StagedReader, StagingStorage
from pyrigaud.application.ports.transfer_metrics import TransferPhase
from pyrigaud.application.transfer_progress import TransferProgress
from pyrigaud.application.use_cases.transfers import (
    TransferContext,
    Watched,
    claimed,
)
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import name_problem
from pyrigaud.domain.chunks import Chunks
from pyrigaud.domain.default_names import imported_disk_name
from pyrigaud.domain.disk_images import (
    JUDGED_PREFIX_BYTES,
    JudgedImage,
    LandedDisk,
    name_clash,
    peek_header,
)
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.hardware import BootNeed, VirtualHardware
from pyrigaud.domain.models import ImportRequest, ImportResult
from pyrigaud.domain.staging import StagedDigest, StagedLocation

# What a staged object's name may end with that is no part of the disk's name.

logger = logging.getLogger(__name__)


class ImportDisk:
    def __init__(
        self,
        disks: DiskLanding,
        judge: ImageJudge,
        capabilities: CapabilitySource,
        transfers: TransferContext,
    ) -> None:
        self._disks = disks
        self._judge = judge
        self._capabilities = capabilities
        self._transfers = transfers
        self._staging = transfers.staging

    def __call__(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        match self._transfers.admitted(request, self._claimed):
            case Failure() as failed:
                return failed
            case Success((ImportRequest() as carried_request, StagedLocation() as source)):
                pass
        with self._transfers.watched("import", source) as watched:
            return watched.counted(self._import(carried_request, source, watched))

    def _claimed(self, request: ImportRequest) -> Result[None, ProviderError]:
        """The import as it is carried out, claimed by the capabilities."""
        return claimed(request, self._capabilities.capabilities())

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
        site: LandingSite
        landing = Result.do(
            found
            for stem in _imported_stem(request.target_name, source, self._disks.disk_suffix)
            for found in self._disks.landing_site(stem, request.storage_hint)
        )
        match landing:
            case Failure() as failed:
                return failed
            case Success(site):
                pass
        self._transfers.sweep(source)
        manifest = _staged_manifest(self._staging, source)
        match self._staging.open_read(source):
            case Failure() as failed:
                return failed
            case Success(reader):
                pass
        try:
            match site.earlier_record():
                case Failure() as failed:
                    return failed
                case Success(bytes() as record):
                    watched.phase = TransferPhase.VERIFY
                    return _answer_again(record, reader, source, expected, site, watched=watched)
            # The staged bytes received by the hypervisor, checked, then made the disk.
            landed = Result.do(
                made
                for received, digest, boot in self._received(
                    site, reader, source, expected, watched
                )
                for made in _made_disk(received, digest, boot, watched)
            )
        finally:
            reader.close()
        match landed:
            case Failure() as failed:
                return failed
            case Success(_Landed(disk, digest, boot)):
                pass
        watched.phase = TransferPhase.COMMIT
        result = ImportResult(
            disk_id=site.disk_name,
            path=disk.path,
            actual_size_bytes=digest.size_bytes,
            checksum=digest.sha256,
        )
        kept = ImportRecord(
            result=result, hardware=_guest_hardware(manifest, digest, source), boot=boot
        )
        return Result.do(result for _ in site.keep_record(render_record(kept), disk))

    def _received(
        self,
        site: LandingSite,
        reader: StagedReader,
        source: StagedLocation,
        expected: str | None,
        watched: Watched,
    ) -> Result[tuple[ReceivedDisk, StagedDigest, BootNeed], ProviderError]:
        """The staged bytes held by the hypervisor once their format is judged and their
        checksum matches, with the firmware the judge says the disk boots by; nothing is held
        otherwise."""
        progress = TransferProgress(f"import of {source.name!r}", source, watched.clock)
        inspection = self._judge.inspect(reader.size_bytes, fields.SOURCE_URL)
        chunks = _staged_chunks(reader, progress, watched, inspection.feed)
        watched.phase = TransferPhase.READ
        judged = Result.do(
            (rest, image)
            for _, rest in chunks.consumed_by(partial(peek_header, count=JUDGED_PREFIX_BYTES))
            for image in _judged(watched, inspection.first_look)
        )
        match judged:
            case Failure() as failed:
                return failed
            case Success((Chunks() as rest, JudgedImage() as image)):
                pass
        watched.phase = TransferPhase.WRITE

        def cut_short(held: Result[ReceivedDisk, ProviderError]) -> None:
            """The stream's own failure (a read, a cancelled call) is what happened when it cut
            the bytes short: it is answered, not the landing site's, and what was held goes."""
            watched.phase = TransferPhase.READ
            match held:
                case Success(held_disk):
                    held_disk.discard()

        receive = partial(site.receive, size_bytes=reader.size_bytes, image=image, watch=progress)
        match rest.answered_by(receive, cut_short=cut_short):
            case Failure() as failed:
                return failed
            case Success(received):
                pass
        digest = reader.digest()
        watched.phase = TransferPhase.VERIFY
        checked = Result.do(
            whole.boot
            for whole in inspection.verdict()
            for _ in _checksum_matches(digest.sha256, expected)
        )
        match checked:
            case Failure() as failed:
                received.discard()
                return failed
            case Success(boot):
                pass
        progress.finished(digest)
        return Success((received, digest, boot))


@dataclass(frozen=True)
class _Landed:
    disk: LandedDisk
    digest: StagedDigest  # of the staged bytes
    boot: BootNeed  # the firmware the disk can boot by, as its first sectors say


def _made_disk(
    received: ReceivedDisk, digest: StagedDigest, boot: BootNeed, watched: Watched
) -> Result[_Landed, ProviderError]:
    """The received bytes made the disk; whatever landing left over discarded."""
    watched.phase = TransferPhase.COMMIT
    try:
        landed = received.land()
    finally:
        received.discard()
    return landed.map(partial(_Landed, digest=digest, boot=boot))


def _staged_manifest(staging: StagingStorage, source: StagedLocation) -> bytes | None:
    """The hardware manifest staged beside the disk (an export of this project wrote it), read
    whole up to one byte past its bound; None when there is none (upstream's exports write
    none) or it cannot be read: the disk is imported all the same."""
    match staging.open_read(source.companion(MANIFEST_SUFFIX)):
        case Failure(error):
            if error.kind is not ErrorKind.NOT_FOUND:
                logger.warning(
                    "import of %r: its hardware manifest could not be read, imported without "
                    "it: %s",
                    source.name,
                    error.message,
                )
            return None
        case Success(reader):
            pass
    raw = b""
    try:
        while len(raw) <= MAX_MANIFEST_BYTES:
            match reader.read_chunk():
                case Failure(error):
                    logger.warning(
                        "import of %r: its hardware manifest could not be read, imported "
                        "without it: %s",
                        source.name,
                        error.message,
                    )
                    return None
                case Success(b""):
                    break
                case Success(chunk):
                    raw += chunk
    finally:
        reader.close()
    return raw


def _guest_hardware(
    manifest: bytes | None, digest: StagedDigest, source: StagedLocation
) -> VirtualHardware | None:
    """What the manifest says the guest boots on, when it is one to trust for these bytes; a
    manifest that is not is ignored with a warning naming why, never a failed import."""
    if manifest is None:
        logger.info("import of %r: no hardware manifest beside it", source.name)
        return None
    hardware, why = read_manifest(manifest, digest.sha256)
    if hardware is None:
        logger.warning("import of %r: hardware manifest ignored: %s", source.name, why)
        return None
    logger.info(
        "import of %r: its guest booted on %s (%s, disk on %s, NICs %s)",
        source.name,
        hardware.source_hypervisor or "another hypervisor",
        hardware.firmware.value,
        hardware.disk_controller or "an unknown controller",
        ", ".join(model or "unknown" for model in hardware.nic_models) or "none",
    )
    return hardware


def _imported_stem(
    target_name: str, source: StagedLocation, disk_suffix: str
) -> Result[str, ProviderError]:
    """The imported disk's name before the hypervisor's `disk_suffix`: `target_name` as given,
    else the staged object's name without its format's suffix. The one check of the name (the
    wire takes it as it comes, and no backend checks it again)."""
    if target_name:
        # Without its suffix a good name stays one: its first character stays.
        return Result.do(name.removesuffix(disk_suffix) for name in _checked_name(target_name, ""))
    return _checked_name(imported_disk_name(source.name), " (it names the imported disk)")


def _checked_name(name: str, why: str) -> Result[str, ProviderError]:
    problem = name_problem(name)
    if problem is not None:
        return Failure(ProviderError.invalid_spec(fields.TARGET_NAME, f"{problem}{why}"))
    return Success(name)


def _staged_chunks(
    reader: StagedReader,
    progress: TransferProgress,
    watched: Watched,
    inspect: Callable[[bytes], None] = lambda _: None,
) -> Chunks[bytes]:
    """The staged object's chunks, counted and shown to `inspect`; the first failure (a
    cancelled call too) ends them early and is what consuming them answers."""

    def read() -> Iterator[Result[bytes, ProviderError]]:
        while True:
            counted = Result.do(
                chunk for chunk in reader.read_chunk() for _ in progress.add(len(chunk))
            )
            match counted:
                case Success(b""):
                    return
                case Success(chunk):
                    watched.moved(len(chunk))
                    inspect(chunk)
            yield counted

    return Chunks(read())


def _judged(
    watched: Watched, first_look: Callable[[], Result[JudgedImage, ProviderError]]
) -> Result[JudgedImage, ProviderError]:
    watched.phase = TransferPhase.VERIFY
    return first_look()


def _checksum_matches(actual: str, expected: str | None) -> Result[None, ProviderError]:
    if expected is not None and actual != expected:
        return Failure(_checksum_mismatch(actual, expected))
    return Success(None)


def _drained(
    reader: StagedReader, progress: TransferProgress, watched: Watched
) -> Result[str, ProviderError]:
    """The SHA-256 of the whole staged object, read to its end."""

    def sha256(_read: None) -> str:
        return reader.digest().sha256

    return _staged_chunks(reader, progress, watched).consumed_by(_read_to_end).map(sha256)


def _read_to_end(chunks: Iterator[bytes]) -> None:
    for _ in chunks:
        pass


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
    parsed = parse_record(record)
    if parsed is None:
        return Failure(_clash(site))
    earlier = parsed.result
    staged: Result[str, ProviderError] = (
        Success(expected)
        if expected is not None
        else (
            _drained(
                reader,
                TransferProgress(f"checksum of {site.disk_name!r}", source, watched.clock),
                watched,
            )
        )
    )
    match staged:
        case Success(sha256) if earlier.checksum == sha256:
            return Success(earlier)
        case Failure() as failed:
            return failed
    return Failure(_clash(site))


def _clash(site: LandingSite) -> ProviderError:
    return name_clash(site.place, f"an imported disk {site.disk_name!r}")


def _checksum_mismatch(actual: str, expected: str) -> ProviderError:
    """FAILED_PRECONDITION: the staged bytes are not the exported ones; nothing was imported."""
    return ProviderError.failed_precondition(
        f"expected_checksum: the staged object's sha256 is {actual}, not {expected}; "
        "nothing was imported (export the disk again)"
    )
