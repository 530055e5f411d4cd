"""The libvirt side of a disk transfer: a volume's bytes through libvirt's streams
(virStorageVolDownload / virStorageVolUpload, so any transport: local, ssh, libssh, tcp), and
the temporary volumes a transfer makes in a pool.

A temporary volume is named `xfer.<owner>.<start>.<token>.<purpose>.<format>`
(`domain/staging_names.py`): a provider killed mid-transfer leaves one the sweep recognises
as its own and old (`TransferVolumes.sweep`), never one it could mistake for a disk. An import
written in place under its disk's final name is marked by a small volume beside it,
`<disk>.pyrigaud-landing.json` (the owner and the start), from before its first byte until its
record is kept: the sweep removes an old mark of its own with the disk it marks, unless that
disk's record was kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import libvirt
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import Caught, best_effort, or_none, refusal
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.errors import MISSING_CODES, error_code
from pyrigaud.adapters.hypervisors.libvirt.pool_jobs import building_in
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    VirStoragePool,
    delete_volume,
    find_volume,
    refresh_pool,
)
from pyrigaud.application.ports import Clock
from pyrigaud.domain.disk_images import IMPORT_RECORD_SUFFIX
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging_names import transfer_volume_name, transfer_volume_started_at

CHUNK_BYTES = 1024 * 1024
SEGMENT_BYTES = 8 * CHUNK_BYTES  # one download stream: what libvirt may queue (a stream: ~2 ms)
ZEROS = bytes(CHUNK_BYTES)  # a hole's chunk (immutable: shared by every hole)
AT_HOLE = -3  # what a read that stops at holes answers at one (virStreamRecvFlags)
# What a daemon or pool that cannot stream sparsely answers the flag with.
SPARSE_REFUSALS = frozenset(
    {libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED}
)
LANDING_MARK_SUFFIX = ".pyrigaud-landing.json"
MAX_MARK_BYTES = 4096  # a mark is a few dozen bytes: a larger volume of the name is not one
VirStorageVol = Any
T = TypeVar("T")

logger = logging.getLogger(__name__)


def volume_chunks(conn: VirConnect, volume: VirStorageVol) -> Iterator[bytes]:
    """The volume's bytes through libvirt download streams, one SEGMENT_BYTES range at a time.

    libvirt's client queues what the daemon sends on a stream without limit, so one stream
    over the whole volume would pile up in this process whatever the staging storage is slower
    by (hundreds of MiB toward S3 or NFS); a range per stream bounds that to one segment.

    The streams are sparse where the pool can tell holes (a file's unallocated ranges): the
    daemon neither reads nor sends them, and they come out here as zero chunks, so a mostly
    empty disk costs what its data does. A daemon or pool that refuses sparse streams is
    read densely.
    """
    offset = 0
    sparse = True
    pool = volume.storagePoolLookupByVolume()
    while True:
        received = 0
        segment, sparse = _opened_segment(conn, pool, volume, offset, sparse=sparse)
        for chunk in segment:
            received += len(chunk)
            yield chunk
        offset += received
        if received < SEGMENT_BYTES:
            return


def _opened_segment(
    conn: VirConnect, pool: VirStoragePool, volume: VirStorageVol, offset: int, *, sparse: bool
) -> tuple[Iterator[bytes], bool]:
    """The download of one segment of `pool`'s `volume`, and whether it is sparse (the flag is
    dropped for good once refused). libvirtd counts a download's start as a job of the pool,
    during which it refuses the pool's refresh: a build, as pool_jobs.py keeps them."""
    if sparse:
        stream = conn.newStream(0)
        with building_in(pool):
            refused = refusal(
                partial(
                    volume.download,
                    stream,
                    offset,
                    SEGMENT_BYTES,
                    libvirt.VIR_STORAGE_VOL_DOWNLOAD_SPARSE_STREAM,
                ),
                SPARSE_REFUSALS,
            )
        if refused is None:
            return _segment(stream, sparse=True), True
    stream = conn.newStream(0)
    with building_in(pool):
        volume.download(stream, offset, SEGMENT_BYTES, 0)
    return _segment(stream, sparse=False), False


def _segment(stream: Any, *, sparse: bool) -> Iterator[bytes]:
    try:
        yield from _sparse_chunks(stream) if sparse else _dense_chunks(stream)
        stream.finish()
    except BaseException:
        best_effort(stream.abort)
        raise


def _dense_chunks(stream: Any) -> Iterator[bytes]:
    while data := _data(stream.recv(CHUNK_BYTES)):
        yield data


def _sparse_chunks(stream: Any) -> Iterator[bytes]:
    """The stream's data, and each hole as zero chunks of at most CHUNK_BYTES."""
    while True:
        received = stream.recvFlags(CHUNK_BYTES, libvirt.VIR_STREAM_RECV_STOP_AT_HOLE)
        if received == AT_HOLE:
            left = int(stream.recvHole(0))
            while left > 0:
                yield ZEROS if left >= CHUNK_BYTES else ZEROS[:left]
                left -= CHUNK_BYTES
            continue
        data = _data(received)
        if not data:
            return
        yield data


def _data(received: bytes | int) -> bytes:
    """What a blocking stream's read gave: its bytes, empty at its end."""
    if isinstance(received, int):  # -2 (would block) only happens on non-blocking streams
        raise libvirt.libvirtError(f"the libvirt stream answered {received} instead of data")
    return bytes(received)


def refusing_unsupported(direction: str, transfer: Callable[[], T]) -> Result[T, ProviderError]:
    """A driver without volume streams (libvirt's test driver) gets an honest UNSUPPORTED."""

    def unsupported(error: libvirt.libvirtError) -> ProviderError | None:
        if error_code(error) != libvirt.VIR_ERR_NO_SUPPORT:
            return None
        return ProviderError.unsupported(
            f"this libvirt driver cannot {direction} volumes (virStorageVol"
            f"{direction.capitalize()}): disk transfer needs a real hypervisor"
        )

    with Caught(unsupported) as edge:
        return Success(transfer())
    return edge.failure


@dataclass(frozen=True)
class TransferVolumes:
    """Names and removes the temporary volumes of this provider's transfers."""

    owner: str
    clock: Clock

    def name(self, purpose: str, disk_format: str) -> str:
        return transfer_volume_name(
            self.owner, self.clock.now(), secrets.token_hex(4), purpose, disk_format
        )

    @contextlib.contextmanager
    def temporary(self, conn: VirConnect, path: str) -> Iterator[str]:
        """`path`, a volume made for the block, removed when the block ends, however it ends."""
        try:
            yield path
        finally:
            delete_volume(conn, path)

    def landing_mark(self) -> bytes:
        """What a landing mark made now holds: this provider's owner mark and the time."""
        return json.dumps({"owner": self.owner, "started_at": int(self.clock.now())}).encode()

    def sweep(self, conn: VirConnect, older_than_seconds: float) -> tuple[str, ...]:
        """Remove this provider's temporary volumes, and its in-place imports, started longer
        ago than `older_than_seconds`, in every active pool; the names removed."""
        now = self.clock.now()
        removed: list[str] = []
        for pool in conn.listAllStoragePools(libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE):
            for volume in _volumes(pool):
                name = str(volume.name())
                if name.endswith(LANDING_MARK_SUFFIX):
                    started = self._landing_started_at(conn, volume)
                    if started is not None and now - started >= older_than_seconds:
                        removed.extend(_unfinished_landing_removed(conn, pool, volume))
                    continue
                started = transfer_volume_started_at(name, self.owner)
                if started is None or now - started < older_than_seconds:
                    continue
                if refusal(partial(volume.delete, 0), MISSING_CODES) is not None:
                    continue  # gone meanwhile
                removed.append(name)
        return tuple(removed)

    def _landing_started_at(self, conn: VirConnect, mark: VirStorageVol) -> int | None:
        """When the landing `mark` was made, if it is one of this provider's; else None."""
        if int(mark.info()[1]) > MAX_MARK_BYTES:
            return None
        try:
            fields = json.loads(b"".join(volume_chunks(conn, mark)))
        except ValueError:
            return None
        if not isinstance(fields, dict) or fields.get("owner") != self.owner:
            return None
        started = fields.get("started_at")
        return started if isinstance(started, int) else None


def _unfinished_landing_removed(
    conn: VirConnect, pool: VirStoragePool, mark: VirStorageVol
) -> tuple[str, ...]:
    """The disk `mark` marks (cut off part-way, or before its record was kept) and the mark;
    a disk whose record was kept stays: only the mark outlived it."""
    mark_name = str(mark.name())
    disk_name = mark_name.removesuffix(LANDING_MARK_SUFFIX)
    removed: list[str] = []
    disk = find_volume(pool, disk_name)
    if disk is not None and find_volume(pool, f"{disk_name}{IMPORT_RECORD_SUFFIX}") is None:
        delete_volume(conn, disk)
        removed.append(disk_name)
    delete_volume(conn, str(mark.path()))
    removed.append(mark_name)
    return tuple(removed)


def _volumes(pool: VirStoragePool) -> list[VirStorageVol]:
    refresh_pool(pool)  # at best: a volume that vanished meanwhile
    return list(or_none(partial(pool.listAllVolumes, 0)) or ())
