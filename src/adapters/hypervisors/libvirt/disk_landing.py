"""An import landed in a libvirt storage pool, in one of two ways.

A qcow2 the judge names keepable (plain: no internal snapshots, no incompatible feature; its
tables checked as its bytes passed, before the disk is answered) is written in place: its
bytes go up one stream into the disk's final volume, which is the disk as it is, with no
second copy on the host. A landing mark beside it,
`<disk>.pyrigaud-landing.json`, is made before the first byte and removed once the import's
record is kept, so an unfinished disk is never taken for a finished one: while it is there, an
import of the name answers UNAVAILABLE, and the leftover sweep removes an old one with its disk
(`volume_streams.py`), as vSphere's building marks do for an import's VM.

Any other image (raw, a sparse vmdk, a qcow2 with snapshots or features qemu may lack) is held
in a temporary volume of the target pool until its checksum and judgement are known (format
conversion needs a seekable file, and the pool has the room a pod's /tmp lacks), then converted
by libvirt into the final qcow2 volume (`createXMLFrom`, as judged by the bytes' header). A
killed provider leaves at most a marked temporary the sweep removes; the final volume is made by
libvirtd in one call, which a provider's death does not cut.

A small volume beside the disk, `<disk>.pyrigaud-import.json`, keeps the import's record; a
disk of that name without one and without a landing mark (an import killed after libvirt
converted it, before it kept its record) is compared by content, as the same bytes converted
again give the same volume.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import PurePosixPath
from typing import TypeVar

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.libvirt.calls import caught
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    VirStoragePool,
    delete_volume,
    find_pool,
    find_volume,
    refreshed_view,
    volume_facts,
    volume_made_from,
    volume_xml,
    write_new_volume,
)
from pyrigaud.adapters.hypervisors.libvirt.volume_streams import (
    LANDING_MARK_SUFFIX,
    TransferVolumes,
    refusing_unsupported,
    volume_chunks,
)
from pyrigaud.application.ports.disk_transfer import ReceivedDisk, TransferWatch
from pyrigaud.domain import fields
from pyrigaud.domain.disk_images import IMPORT_RECORD_SUFFIX, JudgedImage, LandedDisk, name_clash
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
        return self.run(partial(import_record_beside, name=self.disk_name))

    @property
    def landing_mark_name(self) -> str:
        return f"{self.disk_name}{LANDING_MARK_SUFFIX}"

    def unfinished(self, pool: VirStoragePool) -> Result[None, ProviderError]:
        """UNAVAILABLE while the disk is being written in place and has no record yet."""
        if (
            find_volume(pool, self.landing_mark_name) is None
            or find_volume(pool, f"{self.disk_name}{IMPORT_RECORD_SUFFIX}") is not None
        ):
            return Success(None)
        return Failure(
            ProviderError.unavailable(
                f"an import of the disk {self.disk_name!r} into {self.place} has not finished "
                "(a provider is writing it, or was stopped part-way: the leftover sweep "
                "removes that); retry later"
            )
        )

    def receive(
        self,
        chunks: Iterable[bytes],
        size_bytes: int | None,
        image: JudgedImage,
        watch: TransferWatch,
    ) -> Result[ReceivedDisk, ProviderError]:
        """A plain qcow2 written in place, when no disk of the name is there; any other image
        in a temporary volume, to be converted by libvirt. Nothing runs here but the upload of
        the chunks, which the use case counts and stops as they pass."""
        del watch

        def received(conn: VirConnect, pool: VirStoragePool) -> Result[ReceivedDisk, ProviderError]:
            if image.keepable_qcow2 and find_volume(pool, self.disk_name) is None:
                return self._written_in_place(conn, pool, chunks, size_bytes)
            return self._uploaded(
                conn,
                pool,
                self.volumes.name("import", image.format),
                chunks,
                size_bytes=size_bytes,
                disk_format=image.format,
            ).map(partial(_ReceivedVolume, self))

        return self.run(received, once=True)

    def _written_in_place(
        self,
        conn: VirConnect,
        pool: VirStoragePool,
        chunks: Iterable[bytes],
        size_bytes: int | None,
    ) -> Result[ReceivedDisk, ProviderError]:
        """The bytes in the disk's own volume, its landing mark made first; on any failure,
        neither."""
        mark = self.volumes.landing_mark()

        def marked() -> str:
            return write_new_volume(
                conn,
                pool,
                volume_xml(self.landing_mark_name, len(mark), volume_format="raw"),
                (mark,),
                self.host.write_volume,
                read_back=False,
            )

        def taken(error: libvirt.libvirtError) -> ProviderError | None:
            if error_code(error) != libvirt.VIR_ERR_STORAGE_VOL_EXIST:
                return None
            return ProviderError.unavailable(
                f"another import of the disk {self.disk_name!r} into {self.place} began "
                "meanwhile; retry later"
            )

        def written(mark_path: str) -> Result[ReceivedDisk, ProviderError]:
            disk = undone_on_failure(
                partial(
                    self._uploaded,
                    conn,
                    pool,
                    self.disk_name,
                    chunks,
                    size_bytes=size_bytes,
                    disk_format="qcow2",
                ),
                partial(delete_volume, conn, mark_path),
            )
            return disk.map(partial(_WrittenInPlace, self, mark_path=mark_path))

        return caught(partial(refusing_unsupported, "upload", marked), taken).bind(written)

    def _uploaded(
        self,
        conn: VirConnect,
        pool: VirStoragePool,
        name: str,
        chunks: Iterable[bytes],
        *,
        size_bytes: int | None,
        disk_format: str,
    ) -> Result[str, ProviderError]:
        """The bytes in new volume `name`, a raw placeholder of their exact size: the upload
        leaves exactly them, and a refresh of the pool reads their format and virtual size
        back, which libvirt's conversion and every later use of the disk go by. The view is
        read under the refresh, where no build of this process can have refused it
        (pool_jobs.py); a refresh refused all the same, or a volume gone meanwhile, is
        transient (UNAVAILABLE). A pool that, freshly refreshed, reads another format back than
        the judge's cannot hold the image (UNIMPLEMENTED). Either way, the volume goes."""

        def read_back(path: str) -> Result[str, ProviderError]:
            with refreshed_view(pool) as fresh:
                landed = volume_facts(conn, path) if fresh else None
            if landed is not None and landed.format == disk_format:
                return Success(path)
            delete_volume(conn, path)
            if landed is None:
                return Failure(
                    ProviderError.unavailable(
                        f"{self.place} could not be refreshed to read the staged {disk_format} "
                        "image back (another client is building a volume in it, or the pool "
                        "stopped); retry later"
                    )
                )
            return Failure(
                ProviderError.unsupported(
                    f"storage pool {self.pool!r} did not recognise the staged "
                    f"{disk_format} image: import into a directory pool"
                )
            )

        return refusing_unsupported(
            "upload",
            partial(
                write_new_volume,
                conn,
                pool,
                volume_xml(name, size_bytes or 0, volume_format="raw"),
                chunks,
                self.host.write_volume,
                read_back=False,
            ),
        ).bind(read_back)

    def keep_record(self, record: bytes, landed: LandedDisk) -> Result[None, ProviderError]:
        """The record in a small volume beside the disk; a disk this import made goes if its
        record cannot be kept. Either way, the disk's landing mark (if it was written in
        place) goes after: the record now tells a finished disk."""

        def keep(conn: VirConnect, pool: VirStoragePool) -> Result[None, ProviderError]:
            try:
                return kept_or_undone(conn, pool)
            finally:
                if (mark := find_volume(pool, self.landing_mark_name)) is not None:
                    delete_volume(conn, mark)

        def kept_or_undone(conn: VirConnect, pool: VirStoragePool) -> Result[None, ProviderError]:
            def kept() -> Result[None, ProviderError]:
                write_new_volume(
                    conn,
                    pool,
                    volume_xml(
                        f"{self.disk_name}{IMPORT_RECORD_SUFFIX}", len(record), volume_format="raw"
                    ),
                    (record,),
                    self.host.write_volume,
                    read_back=False,
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

        def in_pool(conn: VirConnect) -> Result[T, ProviderError]:
            return find_pool(conn, self.pool, host.pools, fields.STORAGE_HINT).bind(
                partial(action, conn)
            )

        return run("import disk", in_pool)


class _WrittenInPlace:
    """The staged bytes already in the disk's own volume `path`, marked by `mark_path`."""

    def __init__(self, site: PoolSite, path: str, mark_path: str) -> None:
        self._site = site
        self._path = path
        self._mark_path = mark_path
        self._landed = False

    def land(self) -> Result[LandedDisk, ProviderError]:
        """The volume is the disk (the judge checked its tables as its bytes passed); its
        mark goes with the record."""
        self._landed = True
        return Success(LandedDisk(path=self._path))

    def discard(self) -> None:
        """Before `land`: the disk and its mark removed. After: nothing is left over."""
        if self._landed:
            return

        def remove(conn: VirConnect) -> Result[None, ProviderError]:
            delete_volume(conn, self._path)
            delete_volume(conn, self._mark_path)
            return Success(None)

        match self._site.host.run("remove an import written in place", remove):
            case Failure(error):
                logger.warning("could not remove an unfinished import's volume: %s", error)


@dataclass(frozen=True)
class _ReceivedVolume:
    """The staged bytes in temporary volume `staged` of the site's pool."""

    site: PoolSite
    staged: str

    def land(self) -> Result[LandedDisk, ProviderError]:
        def landed(conn: VirConnect, pool: VirStoragePool) -> Result[LandedDisk, ProviderError]:
            existing = find_volume(pool, self.site.disk_name)
            if existing is None:
                return Result.do(
                    LandedDisk(path=path)
                    for path in _converted(conn, pool, self.staged, self.site.disk_name)
                )
            # no record: another import is writing it in place, or was killed before its record
            return Result.do(
                LandedDisk(path=path, made_now=False)
                for _ in self.site.unfinished(pool)
                for path in self._earlier_import(conn, pool, existing)
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
        clash = name_clash(
            f"storage pool {self.site.pool!r}", f"a volume {PurePosixPath(existing).name!r}"
        )
        volumes = self.site.volumes

        def cannot_tell(_error: libvirt.libvirtError) -> ProviderError:
            return clash  # a driver that cannot download: cannot tell

        def same_content(again: str) -> Result[bool, ProviderError]:
            return Success(_sha256_of(conn, existing) == _sha256_of(conn, again))

        def existing_if_same(equal: bool) -> Result[str, ProviderError]:
            return Success(existing) if equal else Failure(clash)

        def compared(converted_again: str) -> Result[str, ProviderError]:
            with volumes.temporary(conn, converted_again) as again:
                same = caught(partial(same_content, again), cannot_tell)
            return same.bind(existing_if_same)

        return _converted(conn, pool, self.staged, volumes.name("compare", "qcow2")).bind(compared)


def import_record_beside(
    conn: VirConnect, pool: VirStoragePool, name: str
) -> Result[bytes | None, ProviderError]:
    """The record of an import into volume `name` that is still there (an earlier import's,
    or the one Create reads back); the record of a volume deleted since is removed."""
    record_path = find_volume(pool, f"{name}{IMPORT_RECORD_SUFFIX}")
    if record_path is None:
        return Success(None)
    if find_volume(pool, name) is None:
        delete_volume(conn, record_path)
        return Success(None)
    record = conn.storageVolLookupByPath(record_path)
    if int(record.info()[1]) > MAX_RECORD_BYTES:
        return Success(b"")  # not one of ours: a clash

    def record_chunks() -> list[bytes]:
        return list(volume_chunks(conn, record))

    return refusing_unsupported("download", record_chunks).map(b"".join)


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

    def made() -> Result[str, ProviderError]:
        return Success(volume_made_from(pool, volume_xml(name, capacity), origin))

    return caught(made, refused)


def _sha256_of(conn: VirConnect, path: str) -> str:
    digest = hashlib.sha256()
    for chunk in volume_chunks(conn, conn.storageVolLookupByPath(path)):
        digest.update(chunk)
    return digest.hexdigest()
