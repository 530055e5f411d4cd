"""The libvirt side of a disk transfer: a volume's bytes through libvirt's streams
(virStorageVolDownload / virStorageVolUpload, so any transport: local, ssh, libssh, tcp), and
the temporary volumes a transfer makes in a pool.

A temporary volume is named `xfer.<owner>.<start>.<token>.<purpose>.<format>`
(`domain/staging_names.py`): a provider killed mid-transfer leaves one the sweep recognises
as its own and old (`sweep_transfer_volumes`), never one it could mistake for a disk.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import libvirt
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.edge import caught
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code, is_missing
from pyrigaud.adapters.hypervisors.libvirt.storage import VirStoragePool, delete_volume
from pyrigaud.application.ports import Clock
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging_names import transfer_volume_name, transfer_volume_started_at

CHUNK_BYTES = 1024 * 1024
SEGMENT_BYTES = 8 * CHUNK_BYTES  # one download stream: what libvirt may queue (a stream: ~2 ms)
VirStorageVol = Any
T = TypeVar("T")

logger = logging.getLogger(__name__)


def volume_chunks(conn: VirConnect, volume: VirStorageVol) -> Iterator[bytes]:
    """The volume's bytes through libvirt download streams, one SEGMENT_BYTES range at a time.

    libvirt's client queues what the daemon sends on a stream without limit, so one stream
    over the whole volume would pile up in this process whatever the staging storage is slower
    by (hundreds of MiB toward S3 or NFS); a range per stream bounds that to one segment.
    """
    offset = 0
    while True:
        received = 0
        for chunk in _segment(conn, volume, offset):
            received += len(chunk)
            yield chunk
        offset += received
        if received < SEGMENT_BYTES:
            return


def _segment(conn: VirConnect, volume: VirStorageVol, offset: int) -> Iterator[bytes]:
    stream = conn.newStream(0)
    volume.download(stream, offset, SEGMENT_BYTES, 0)
    try:
        while chunk := _received(stream):
            yield chunk
        stream.finish()
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise


def _received(stream: Any) -> bytes:
    """The next chunk of a blocking stream; empty at its end."""
    data = stream.recv(CHUNK_BYTES)
    if isinstance(data, int):  # -2 (would block) only happens on non-blocking streams
        raise libvirt.libvirtError(f"the libvirt stream answered {data} instead of data")
    return bytes(data)


def refusing_unsupported(direction: str, transfer: Callable[[], T]) -> Result[T, ProviderError]:
    """A driver without volume streams (libvirt's test driver) gets an honest UNSUPPORTED."""

    def unsupported(error: libvirt.libvirtError) -> ProviderError | None:
        if error_code(error) != libvirt.VIR_ERR_NO_SUPPORT:
            return None
        return ProviderError.unsupported(
            f"this libvirt driver cannot {direction} volumes (virStorageVol"
            f"{direction.capitalize()}): disk transfer needs a real hypervisor"
        )

    return caught(lambda: Success(transfer()), unsupported)


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

    def sweep(self, conn: VirConnect, older_than_seconds: float) -> tuple[str, ...]:
        """Remove this provider's temporary volumes started longer ago than
        `older_than_seconds`, in every active pool; the names removed."""
        now = self.clock.now()
        removed: list[str] = []
        for pool in conn.listAllStoragePools(libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE):
            for volume in _volumes(pool):
                name = str(volume.name())
                started = transfer_volume_started_at(name, self.owner)
                if started is None or now - started < older_than_seconds:
                    continue
                try:
                    volume.delete(0)
                except libvirt.libvirtError as error:
                    if not is_missing(error):
                        raise
                    continue
                removed.append(name)
        return tuple(removed)


def _volumes(pool: VirStoragePool) -> list[VirStorageVol]:
    try:
        with contextlib.suppress(libvirt.libvirtError):  # a volume that vanished meanwhile
            pool.refresh(0)
        return list(pool.listAllVolumes(0))
    except libvirt.libvirtError as error:
        if is_missing(error):
            return []
        raise
