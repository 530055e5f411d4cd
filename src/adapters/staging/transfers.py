"""What every hypervisor's ExportDisk and ImportDisk do alike around the staging storage port:
read the checked location and expected checksum of a request, name the imported disk, sweep
dead transfers' temporaries where a transfer goes, move chunks in or out of the store with
progress (aborting the staged object on any failure), and answer a retried import from the
record kept beside the disk it made."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import TypeVar

from returns.result import Failure, Result

from pyrigaud.adapters.staging.progress import TransferProgress
from pyrigaud.application.ports.staging import StagedReader, StagedWriter, StagingStorage
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import name_problem
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.models import ImportRequest, ImportResult
from pyrigaud.domain.staging import StagedDigest, StagedLocation

T = TypeVar("T")

STAGED_SUFFIXES = (".qcow2", ".raw", ".vmdk", ".img")
# Beside an imported disk: its import's answer, so a retry answers the same or clashes.
RECORD_SUFFIX = ".pyrigaud-import.json"

logger = logging.getLogger(__name__)


def unwrap(result: Result[T, ProviderError]) -> T:
    """The value, or the failure raised as the ExpectedError the adapter's runner turns back
    into it."""
    if isinstance(result, Failure):
        raise ExpectedError(result.failure())
    return result.unwrap()


def checked_location(location: StagedLocation | None, field: str) -> StagedLocation:
    """The location the wire parser checked (it always fills it)."""
    if location is None:
        raise ExpectedError(ProviderError.invalid_spec(field, "was not checked"))
    return location


def expected_sha256(request: ImportRequest) -> str | None:
    """The checksum an import must match, when it is asked to verify one."""
    if not request.verify_checksum:
        return None
    expected = request.expected_checksum.strip().lower().removeprefix("sha256:")
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise ExpectedError(
            ProviderError.invalid_spec(fields.EXPECTED_CHECKSUM, "must be 64 hex digits")
        )
    return expected


def checksum_mismatch(actual: str, expected: str) -> ExpectedError:
    """FAILED_PRECONDITION: the staged bytes are not the exported ones; nothing was imported."""
    return ExpectedError(
        ProviderError.failed_precondition(
            f"expected_checksum: the staged object's sha256 is {actual}, not {expected}; "
            "nothing was imported (export the disk again)"
        )
    )


def imported_name(target_name: str, source: StagedLocation, final_suffix: str) -> str:
    """The imported disk's name before `final_suffix`: `target_name` as given, else the staged
    object's stem."""
    stem = source.name
    for suffix in STAGED_SUFFIXES:
        stem = stem.removesuffix(suffix)
    name = target_name.removesuffix(final_suffix) if target_name else stem
    problem = name_problem(name)
    if problem is not None:
        raise ExpectedError(
            ProviderError.invalid_spec(
                fields.TARGET_NAME, f"{problem} (it names the imported disk)"
            )
        )
    return name


def sweep_dead_transfers(
    staging: StagingStorage, location: StagedLocation, older_than_seconds: float
) -> None:
    """Where a transfer goes, the staged temporaries of dead ones go first (the periodic sweep
    cannot reach a bucket or an NFS export it was never told about)."""
    swept = staging.sweep(location, older_than_seconds)
    if isinstance(swept, Failure):
        logger.warning("could not sweep staged leftovers: %s", swept.failure())
    elif swept.unwrap():
        logger.info("removed %d abandoned staged temporaries", swept.unwrap())


def write_staged(
    writer: StagedWriter, chunks: Iterable[bytes], progress: TransferProgress
) -> StagedDigest:
    """Every chunk into `writer`, committed; on any failure (a cancelled call too) the writer
    is aborted, so nothing stays staged under a temporary or the final name."""
    try:
        for chunk in chunks:
            unwrap(writer.write(chunk))
            progress.add(len(chunk))
    except BaseException:
        writer.abort()
        raise
    return unwrap(writer.commit())


def staged_chunks(reader: StagedReader, progress: TransferProgress) -> Iterator[bytes]:
    """The staged object's chunks, counted (and stopped when the call is gone)."""
    while chunk := unwrap(reader.read_chunk()):
        progress.add(len(chunk))
        yield chunk


def counted(chunks: Iterable[bytes], progress: TransferProgress) -> Iterator[bytes]:
    """`chunks`, counted as they pass (and stopped when the call is gone)."""
    for chunk in chunks:
        progress.add(len(chunk))
        yield chunk


def import_record(result: ImportResult) -> bytes:
    """The record kept beside an imported disk."""
    return json.dumps(result.model_dump()).encode()


def answer_again(
    record: bytes,
    reader: StagedReader,
    source: StagedLocation,
    *,
    expected: str | None,
    name: str,
    place: str,
) -> ImportResult:
    """A retried import (its first answer was lost) of the same staged bytes answers what
    the record says, without importing again; other bytes under that name (even ones that
    would convert to the same disk) are a clash."""
    try:
        earlier: ImportResult | None = ImportResult.model_validate(json.loads(record))
    except ValueError:
        earlier = None
    if earlier is not None and expected is None:
        for _ in staged_chunks(reader, TransferProgress(f"checksum of {name!r}", source)):
            pass
        expected = reader.digest().sha256
    if earlier is None or earlier.checksum != expected:
        raise ExpectedError(
            ProviderError.already_exists(
                f"target_name: {place} already has an imported disk {name!r} with other "
                "content; delete it or pick another target_name"
            )
        )
    return earlier
