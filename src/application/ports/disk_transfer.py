"""What a hypervisor offers a disk transfer: read a disk at a point in time as a byte stream,
land a byte stream as a disk and say its path, and tell what a disk is.

The transfer itself (staging, checksums, retries, the import record, progress, cancellation)
is the ExportDisk/ImportDisk use cases', the same on every hypervisor; these ports are only
what differs. Disk bytes never travel over gRPC.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import BinaryIO, Protocol

from returns.result import Result

from pyrigaud.domain.disk_images import JudgedImage, LandedDisk, LeftBehind
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskDetails, DiskQuery, DiskRead


class TransferWatch(Protocol):
    """The transfer a hypervisor's part runs in, handed in by its use case: the bytes the
    part moves on its own (read into a scratch file before an image is made of them) counted
    toward its progress, and whether the transfer is still wanted. A part that stops on a
    Failure here cleans up on its way out."""

    def add(self, count: int) -> Result[None, ProviderError]:
        """`count` more bytes moved; UNAVAILABLE once the RPC's caller is gone."""
        ...

    def check(self) -> Result[None, ProviderError]:
        """UNAVAILABLE once the RPC's caller is gone: asked during a step that moves no bytes
        of its own (a qemu-img run)."""
        ...


class DiskStream(Protocol):
    """One disk's bytes, in the format asked for, as they are read off the hypervisor. Whatever
    the read holds on the hypervisor (a lease, a temporary copy) is released by `close`."""

    @property
    def size_bytes(self) -> int | None:
        """How many bytes the stream gives, when the hypervisor tells it beforehand."""
        ...

    @property
    def left_behind(self) -> tuple[LeftBehind, ...]:
        """What of the VM the disk does not carry (its other disks, TPM state, NVRAM)."""
        ...

    @property
    def made_whole_first(self) -> bool:
        """True when the image is made whole in a seekable file before its first byte can be
        read (a qcow2, whose tables are written last): `make` makes it."""
        ...

    def make(self, into: BinaryIO | None) -> Result[None, ProviderError]:
        """Make the image of a stream `made_whole_first`: in `into` (seekable and empty: the
        staged object's own file, which saves a copy; nothing is left to read), or with None
        in a scratch file that `read_chunk` then reads (and `size_bytes` is known). Nothing to
        do for a stream whose bytes come in order."""
        ...

    def read_chunk(self) -> Result[bytes, ProviderError]:
        """The next bounded chunk; b"" at the end."""
        ...

    def close(self) -> None: ...


class DiskReading(Protocol):
    def read_disk(self, disk: DiskRead, watch: TransferWatch) -> Result[DiskStream, ProviderError]:
        """The disk `disk` names (its VM's, at its snapshot if it names one) in `disk.format`;
        what the hypervisor reads in the pod on its own way (a snapshot's file, a vmdk made a
        qcow2) is counted and stopped through `watch`. Refused here, before a byte moves
        (FAILED_PRECONDITION naming why): what cannot be read at one point in time, and what
        cannot move faithfully (a disk shared, raw-mapped or independent of snapshots; a VM
        with passthrough devices)."""
        ...


class ReceivedDisk(Protocol):
    """Bytes held on the hypervisor that are not a disk yet: landed, or discarded."""

    def land(self) -> Result[LandedDisk, ProviderError]:
        """Make the disk of the site's name from them. A disk of that name already there
        (an import killed before it kept its record) is this one when it holds the same disk,
        ALREADY_EXISTS otherwise."""
        ...

    def discard(self) -> None:
        """Remove them; after `land` it removes only what landing left over."""
        ...


class LandingSite(Protocol):
    """Where an import lands, under which name, and its record kept beside the disk."""

    @property
    def disk_name(self) -> str:
        """The imported disk's name on this hypervisor (ImportDisk's `disk_id`)."""
        ...

    @property
    def place(self) -> str:
        """Where, for messages: "storage pool 'default'", "datastore 'ds1'"."""
        ...

    def earlier_record(self) -> Result[bytes | None, ProviderError]:
        """The record kept by an earlier import of this name whose disk is still there (a
        record whose disk is gone is removed); None when there is none."""
        ...

    def receive(
        self,
        chunks: Iterable[bytes],
        size_bytes: int | None,
        image: JudgedImage,
        watch: TransferWatch,
    ) -> Result[ReceivedDisk, ProviderError]:
        """Every chunk, an image of the judged format, held on the hypervisor. The chunks may
        end early (the caller then discards what it got); they are counted as they pass, and
        whatever the site runs besides (a conversion in the pod) is stopped through `watch`."""
        ...

    def keep_record(self, record: bytes, landed: LandedDisk) -> Result[None, ProviderError]:
        """Keep `record` beside the disk; when it cannot be kept, a disk this import made
        (`landed.made_now`) goes too."""
        ...


class DiskLanding(Protocol):
    @property
    def disk_suffix(self) -> str:
        """What a target name may end with that the disk's name adds itself (".qcow2")."""
        ...

    def landing_site(self, stem: str, storage_hint: str) -> Result[LandingSite, ProviderError]:
        """Where a disk named after `stem` lands (`storage_hint`: a pool or datastore, "" for
        the default); refused when an import of that name is still being made elsewhere."""
        ...


class DiskFacts(Protocol):
    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]: ...


class DiskTransfer(DiskReading, DiskLanding, DiskFacts, Protocol):
    """The three, as one hypervisor serves them."""


class TransferLeftovers(Protocol):
    """What transfers killed part-way left in the hypervisor (temporary volumes)."""

    def sweep_transfer_leftovers(
        self, older_than_seconds: float
    ) -> Result[tuple[str, ...], ProviderError]:
        """Remove this provider's leftovers older than `older_than_seconds`; their names."""
        ...
