"""Staging storage: where a migrating disk's bytes wait between ExportDisk and ImportDisk.

Backend-neutral (a PVC, an S3 bucket, an NFS export): the hypervisor adapters stream a disk into
a writer or out of a reader in bounded chunks, and both report the SHA-256 and byte count of
exactly the staged bytes. A writer never exposes a partial object under the final name: it
writes to a temporary marked with this provider's owner mark and its start time, and `commit`
renames (or completes) it atomically. Whatever a crash leaves, `sweep` removes once it is older
than any transfer can still be running, so one replica never removes another's work.
"""

from __future__ import annotations

from typing import BinaryIO, Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedDigest, StagedLocation, StagedSweep, StagingType


class StagedReader(Protocol):
    @property
    def size_bytes(self) -> int | None:
        """The object's size, when the storage tells it."""
        ...

    def read_chunk(self) -> Result[bytes, ProviderError]:
        """The next bounded chunk; b"" at the end."""
        ...

    def digest(self) -> StagedDigest:
        """SHA-256 and byte count of what was read so far (the whole object once at the end)."""
        ...

    def close(self) -> None: ...


class StagedWriter(Protocol):
    """Open, then committed or aborted. A failed write or commit has aborted already."""

    def write(self, chunk: bytes) -> Result[None, ProviderError]: ...

    def commit(self) -> Result[StagedDigest, ProviderError]:
        """Put what was written under the final name at once; on failure nothing is there."""
        ...

    def abort(self) -> Result[None, ProviderError]:
        """Remove everything written so far; a no-op after commit or a second abort."""
        ...


class StagedFile(Protocol):
    """A staged object's temporary as a local file the caller writes in place, for an image
    made out of order (a qcow2's tables are written last): made in the store's own file, it is
    not made in scratch and copied. Committed or aborted, as a StagedWriter is."""

    @property
    def file(self) -> BinaryIO:
        """The temporary, empty, open for reading and writing at any offset."""
        ...

    def commit(self) -> Result[StagedDigest, ProviderError]:
        """Hash what the file holds, then put it under the final name at once; on failure
        nothing is there."""
        ...

    def abort(self) -> Result[None, ProviderError]:
        """Remove the temporary; a no-op after commit or a second abort."""
        ...


class StagingStorage(Protocol):
    def open_read(self, location: StagedLocation) -> Result[StagedReader, ProviderError]:
        """A reader of an existing object (NOT_FOUND when there is none)."""
        ...

    def open_write(
        self, location: StagedLocation, size_bytes: int | None = None
    ) -> Result[StagedWriter, ProviderError]:
        """A writer that replaces the object on commit; `size_bytes` when known helps S3
        choose a part size (an unknown size is planned for the largest object)."""
        ...

    def open_file(self, location: StagedLocation) -> Result[StagedFile | None, ProviderError]:
        """The object's temporary as a local file to write in place, replacing the object on
        commit; None where the store keeps no local files (S3, NFS: use `open_write`)."""
        ...

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        """Remove this provider's temporaries started longer ago than `older_than_seconds`
        where `location` lives (its whole PVC; its folder on NFS; its folder and the folders
        below it on S3); how many."""
        ...


class StagedLeftovers(Protocol):
    def sweep_reachable(self, older_than_seconds: float) -> StagedSweep:
        """`sweep` wherever this storage can look without a request naming a location: every
        mounted PVC and the staging places it was configured with. One place that cannot be
        swept is reported and does not stop the others."""
        ...


class StagingStores(StagingStorage, StagedLeftovers, Protocol):
    """A StagingStorage that also says which staging types it can reach (what to advertise)."""

    @property
    def types(self) -> tuple[StagingType, ...]: ...
