"""An import landed in a libvirt storage pool: the staged bytes held in a temporary volume of
the target pool until their checksum and judgement are known (format conversion needs a
seekable file, and the pool has the room a pod's /tmp lacks), then converted by libvirt into
the final qcow2 volume (`createXMLFrom`: qcow2, raw or a sparse vmdk in, as judged by the
bytes' header). A killed provider leaves at most a marked temporary the sweep removes; the
final volume is made by libvirtd in one call, which a provider's death does not cut. A small
volume beside it, `<disk>.pyrigaud-import.json`, keeps the import's record; a disk of that
name without one (its import killed before keeping it) is compared by content, as the same
bytes converted again give the same volume.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TypeVar

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.context import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.edge import caught
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    VirStoragePool,
    delete_volume,
    find_pool,
    find_volume,
    volume_facts,
    volume_xml,
    write_new_volume,
)
from pyrigaud.adapters.hypervisors.libvirt.volume_streams import (
    TransferVolumes,
    refusing_unsupported,
    volume_chunks,
)
from pyrigaud.application.ports.disk_transfer import ReceivedDisk
from pyrigaud.domain import fields
from pyrigaud.domain.disk_images import IMPORT_RECORD_SUFFIX, JudgedImage, LandedDisk
from pyrigaud.domain.errors import ProviderError

MAX_RECORD_BYTES = 64 * 1024
# How libvirt quotes a failed qemu-img run's own words ("... exit status 1: qemu-img: <why>").
QEMU_IMG_SAYS = "qemu-img: "
T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolSite:
    """An import into storage pool `pool`, as volume `disk_name`; `volumes` names its
    temporaries."""

    host: LibvirtHost
    volumes: TransferVolumes
    pool: str
    disk_name: str

    @property
    def place(self) -> str:
        return f"storage pool {self.pool!r}"

    def earlier_record(self) -> Result[bytes | None, ProviderError]:
        return self.run(lambda conn, pool: _earlier_record(conn, pool, self.disk_name))

    def receive(
        self, chunks: Iterable[bytes], size_bytes: int | None, image: JudgedImage
    ) -> Result[ReceivedDisk, ProviderError]:
        """The bytes in a temporary raw placeholder of their exact size: the upload leaves
        exactly them, and the pool's refresh reads their format and virtual size back."""

        def received(conn: VirConnect, pool: VirStoragePool) -> Result[ReceivedDisk, ProviderError]:
            volumes = self.volumes

            def recognised(staged: str) -> Result[ReceivedDisk, ProviderError]:
                landed = volume_facts(conn, staged)
                if landed is None or landed.format != image.format:
                    delete_volume(conn, staged)
                    return Failure(
                        ProviderError.unsupported(
                            f"storage pool {self.pool!r} did not recognise the staged "
                            f"{image.format} image: import into a directory pool"
                        )
                    )
                return Success(_ReceivedVolume(self, staged))

            return refusing_unsupported(
                "upload",
                lambda: write_new_volume(
                    conn,
                    pool,
                    volume_xml(
                        volumes.name("import", image.format), size_bytes or 0, volume_format="raw"
                    ),
                    chunks,
                    self.host.write_volume,
                ),
            ).bind(recognised)

        return self.run(received, once=True)

    def keep_record(self, record: bytes, landed: LandedDisk) -> Result[None, ProviderError]:
        """The record in a small volume beside the disk; a disk this import made goes if its
        record cannot be kept."""

        def keep(conn: VirConnect, pool: VirStoragePool) -> Result[None, ProviderError]:
            def kept() -> Result[None, ProviderError]:
                write_new_volume(
                    conn,
                    pool,
                    volume_xml(
                        f"{self.disk_name}{IMPORT_RECORD_SUFFIX}", len(record), volume_format="raw"
                    ),
                    (record,),
                    self.host.write_volume,
                )
                return Success(None)

            def forget_the_disk() -> None:
                if landed.made_now:
                    delete_volume(conn, landed.path)

            return undone_on_failure(kept, forget_the_disk)

        return self.run(keep)

    def run(
        self,
        action: Callable[[VirConnect, VirStoragePool], Result[T, ProviderError]],
        *,
        once: bool = False,
    ) -> Result[T, ProviderError]:
        """`action(conn, pool)` at the libvirt edge (`once`: never started over)."""
        host = self.host
        run = host.run_once if once else host.run
        return run(
            "import disk",
            lambda conn: find_pool(conn, self.pool, host.pools, fields.STORAGE_HINT).bind(
                lambda pool: action(conn, pool)
            ),
        )


@dataclass(frozen=True)
class _ReceivedVolume:
    """The staged bytes in temporary volume `staged` of the site's pool."""

    site: PoolSite
    staged: str

    def land(self) -> Result[LandedDisk, ProviderError]:
        def landed(conn: VirConnect, pool: VirStoragePool) -> Result[LandedDisk, ProviderError]:
            existing = find_volume(pool, self.site.disk_name)
            if existing is None:
                return _converted(conn, pool, self.staged, self.site.disk_name).map(
                    lambda path: LandedDisk(path=path)
                )
            # no record: its import was killed before it kept one
            return self._earlier_import(conn, pool, existing).map(
                lambda path: LandedDisk(path=path, made_now=False)
            )

        return self.site.run(landed)

    def discard(self) -> None:
        def remove(conn: VirConnect) -> Result[None, ProviderError]:
            delete_volume(conn, self.staged)
            return Success(None)

        match self.site.host.run("remove a staged import", remove):
            case Failure(error):
                logger.warning("could not remove a staged import's volume: %s", error)

    def _earlier_import(
        self, conn: VirConnect, pool: VirStoragePool, existing: str
    ) -> Result[str, ProviderError]:
        """A disk of that name without a record (its import was killed before keeping one):
        the staged bytes converted again give the same volume (the conversion is
        deterministic) if they made it; other content is a name clash."""
        clash = ProviderError.already_exists(
            f"target_name: storage pool {self.site.pool!r} already has a volume "
            f"{PurePosixPath(existing).name!r} with other content; delete it or pick another "
            "target_name"
        )
        volumes = self.site.volumes

        def compared(converted_again: str) -> Result[str, ProviderError]:
            with volumes.temporary(conn, converted_again) as again:
                same = caught(
                    lambda: Success(_sha256_of(conn, existing) == _sha256_of(conn, again)),
                    lambda _error: clash,  # a driver that cannot download: cannot tell
                )
            return same.bind(lambda equal: Success(existing) if equal else Failure(clash))

        return _converted(conn, pool, self.staged, volumes.name("compare", "qcow2")).bind(compared)


def _earlier_record(
    conn: VirConnect, pool: VirStoragePool, name: str
) -> Result[bytes | None, ProviderError]:
    """The record of an earlier import into volume `name` that is still there; the record of
    a volume deleted since is removed."""
    record_path = find_volume(pool, f"{name}{IMPORT_RECORD_SUFFIX}")
    if record_path is None:
        return Success(None)
    if find_volume(pool, name) is None:
        delete_volume(conn, record_path)
        return Success(None)
    record = conn.storageVolLookupByPath(record_path)
    if int(record.info()[1]) > MAX_RECORD_BYTES:
        return Success(b"")  # not one of ours: a clash
    return refusing_unsupported("download", lambda: list(volume_chunks(conn, record))).map(b"".join)


def _converted(
    conn: VirConnect, pool: VirStoragePool, staged: str, name: str
) -> Result[str, ProviderError]:
    """A qcow2 volume `name` holding the staged image's disk, made by libvirt in one call (its
    qemu-img on the host converts). An image qemu-img refuses (corrupt by qemu's rules) is bad
    input, named with qemu's reason; libvirt has removed what it began."""
    origin = conn.storageVolLookupByPath(staged)
    capacity = int(origin.info()[1])

    def refused(error: libvirt.libvirtError) -> ProviderError | None:
        message = str(error)
        if QEMU_IMG_SAYS not in message:
            return None
        reason = message.rsplit(QEMU_IMG_SAYS, 1)[1].strip()
        return ProviderError.invalid_spec(
            fields.SOURCE_URL, f"qemu-img on the libvirt host refuses the staged image: {reason}"
        )

    return caught(
        lambda: Success(str(pool.createXMLFrom(volume_xml(name, capacity), origin, 0).path())),
        refused,
    )


def _sha256_of(conn: VirConnect, path: str) -> str:
    digest = hashlib.sha256()
    for chunk in volume_chunks(conn, conn.storageVolLookupByPath(path)):
        digest.update(chunk)
    return digest.hexdigest()
