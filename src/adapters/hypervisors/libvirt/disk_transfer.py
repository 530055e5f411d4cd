"""DiskTransfer on libvirt: a VM's volume streamed into staging storage (pvc, s3, nfs), and back.

The bytes travel chunk by chunk between libvirt's volume streams (`volume_streams.py`) and the
StagingStorage port, so no disk is ever held in memory, the same code serves a remote host over
any transport, and nothing here runs a program on the host or in the pod.

Export refuses a running (or paused) VM: QEMU writes to its disk, so a copy would not be from one
point in time. A disk that overlays an image, or a requested format other than the disk's own, is
first copied by libvirt into a temporary standalone volume of that format in the same pool
(flattened and converted on the libvirt host), streamed, then removed. The state at a snapshot
(`snapshot_id`, which the manager's sequence always sends) is read from the qcow2 file's
internal snapshot by `snapshot_export.py`, in a scratch file of the pod.

Import stages the bytes in a temporary volume of the target pool (format conversion needs a
seekable file, and the pool has the room a pod's /tmp lacks), checks their SHA-256 before
anything else is made, then has libvirt convert them into the final qcow2 volume
(`createXMLFrom`: qcow2, raw or a sparse vmdk in, judged by the bytes' header, never by the
`format` field or the key's name). A killed provider leaves at most a marked temporary the sweep
removes; the final volume is made by libvirtd in one call, which a provider's death does not cut.
A small volume beside it, `<disk>.pyrigaud-import.json`, keeps the import's answer: a retry of
the same staged bytes answers it without importing again, other bytes are ALREADY_EXISTS.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import libvirt
from returns.result import Result

from pyrigaud.adapters.disk_images.formats import disk_format_of, peek_header
from pyrigaud.adapters.disk_images.qcow2 import write_qcow2
from pyrigaud.adapters.disk_images.scratch import file_chunks, scratch_file
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DiskDevice, parse_domain
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.snapshot_export import snapshot_disk
from pyrigaud.adapters.hypervisors.libvirt.snapshots import find_snapshot
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
    VirStorageVol,
    refusing_unsupported,
    volume_chunks,
)
from pyrigaud.adapters.staging.progress import TransferProgress
from pyrigaud.adapters.staging.transfers import (
    RECORD_SUFFIX,
    answer_again,
    checked_location,
    checksum_mismatch,
    expected_sha256,
    import_record,
    imported_name,
    staged_chunks,
    sweep_dead_transfers,
    unwrap,
    write_staged,
)
from pyrigaud.application.ports.staging import StagedReader, StagingBackends
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.leftovers import TRANSFER_DEADLINE_SECONDS
from pyrigaud.domain.models import (
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
)
from pyrigaud.domain.staging import StagedDigest, StagedLocation

EXPORT_FORMATS = ("qcow2", "raw")
IMPORT_FORMATS = ("qcow2", "raw", "vmdk")  # what the staged bytes may be; the volume is qcow2
MAX_RECORD_BYTES = 64 * 1024
VirDomain = Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LibvirtDiskTransfer:
    """ExportDisk, ImportDisk, the facts of one disk, and the sweep of transfer leftovers."""

    host: LibvirtHost
    staging: StagingBackends
    volumes: TransferVolumes
    # Staged temporaries and temporary volumes older than this belong to dead transfers.
    abandoned_after_seconds: float = 2 * TRANSFER_DEADLINE_SECONDS
    # Where a snapshot's export keeps its anonymous scratch files (None: the temp directory).
    scratch_dir: str | None = None

    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        return self.host.run(
            f"export disk of {request.vm_id!r}",
            lambda conn: self._export(conn, Guest.by_id(conn, request.vm_id).dom, request),
        )

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        return self.host.run(
            "import disk",  # the URL is not echoed before it is checked
            lambda conn: self._import(conn, request),
        )

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        return self.host.run(
            f"read disk of {query.vm_id!r}", lambda conn: _disk_details(conn, query)
        )

    def sweep_transfer_leftovers(
        self, older_than_seconds: float
    ) -> Result[tuple[str, ...], ProviderError]:
        """This provider's temporary export/import volumes of transfers that died (their
        staged temporaries are the staging storage's to sweep)."""
        return self.host.run(
            "sweep temporary transfer volumes",
            lambda conn: self.volumes.sweep(conn, older_than_seconds),
        )

    def _export(self, conn: VirConnect, dom: VirDomain, request: ExportRequest) -> ExportResult:
        destination = checked_location(request.destination, fields.DESTINATION_URL)
        if request.format not in EXPORT_FORMATS:
            raise ExpectedError(
                ProviderError.unsupported(
                    f"format {request.format!r}: libvirt exports qcow2 or raw"
                )
            )
        facts = parse_domain(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        disk = _chosen_disk(facts.name, facts.disks, request.disk_id)
        if dom.isActive():
            raise ExpectedError(
                ProviderError.failed_precondition(
                    f"VM {facts.name!r} is running (QEMU is writing to its disk): "
                    "power it off first, then export"
                )
            )
        sweep_dead_transfers(self.staging, destination, self.abandoned_after_seconds)
        if request.snapshot_id:
            find_snapshot(Guest(dom), request.snapshot_id)
            digest = self._export_snapshot(conn, disk.path, request, destination)
            return _exported(digest)
        with self._standalone_volume(conn, disk.path, request.format) as volume:
            writer = unwrap(self.staging.open_write(destination, _file_size(volume)))
            progress = TransferProgress(f"export of VM {facts.name!r}", destination)
            digest = refusing_unsupported(
                "download", lambda: write_staged(writer, volume_chunks(conn, volume), progress)
            )
        progress.finished(digest)
        return _exported(digest)

    def _export_snapshot(
        self, conn: VirConnect, path: str, request: ExportRequest, destination: StagedLocation
    ) -> StagedDigest:
        """The disk at an internal snapshot (snapshot_export.py), staged as raw, or as qcow2
        built in a scratch file first (its tables precede its data)."""
        disk = volume_facts(conn, path)
        if disk is None:
            raise ExpectedError(ProviderError.not_found(f"no volume at {path!r}"))
        doing = f"export of snapshot {request.snapshot_id!r}"
        reading = TransferProgress(f"{doing}, reading the disk", destination)
        with contextlib.ExitStack() as stack:
            backing = (
                stack.enter_context(self._standalone_volume(conn, disk.backing_path, "raw"))
                if disk.backing_path
                else None
            )
            raw = stack.enter_context(
                snapshot_disk(
                    conn,
                    disk,
                    request.snapshot_id,
                    backing=backing,
                    scratch_dir=self.scratch_dir,
                    progress=reading,
                )
            )
            progress = TransferProgress(doing, destination)
            if request.format == "raw":
                writer = unwrap(self.staging.open_write(destination, disk.capacity_bytes))
                digest = write_staged(writer, raw, progress)
            else:
                image = stack.enter_context(scratch_file(self.scratch_dir))
                size = write_qcow2(raw, disk.capacity_bytes, image)
                image.seek(0)
                writer = unwrap(self.staging.open_write(destination, size))
                digest = write_staged(writer, file_chunks(image), progress)
        progress.finished(digest)
        return digest

    @contextlib.contextmanager
    def _standalone_volume(
        self, conn: VirConnect, path: str, disk_format: str
    ) -> Iterator[VirStorageVol]:
        """The volume at `path` if it is standalone and of `disk_format`, else a temporary
        copy that is (libvirt flattens and converts it on its host), removed afterwards."""
        volume = conn.storageVolLookupByPath(path)
        facts = volume_facts(conn, path)
        if facts is not None and not facts.backing_path and facts.format == disk_format:
            yield volume
            return
        capacity = int(volume.info()[1])
        pool = volume.storagePoolLookupByVolume()
        with self.volumes.temporary(
            conn,
            lambda name: str(
                pool.createXMLFrom(
                    volume_xml(name, capacity, volume_format=disk_format), volume, 0
                ).path()
            ),
            self.volumes.name("export", disk_format),
        ) as copy:
            yield conn.storageVolLookupByPath(copy)

    def _import(self, conn: VirConnect, request: ImportRequest) -> ImportResult:
        source = checked_location(request.source, fields.SOURCE_URL)
        expected = expected_sha256(request)
        name = f"{imported_name(request.target_name, source, '.qcow2')}.qcow2"
        pool_name = request.storage_hint or self.host.pools.default_pool
        pool = find_pool(conn, pool_name, self.host.pools, fields.STORAGE_HINT)
        sweep_dead_transfers(self.staging, source, self.abandoned_after_seconds)
        reader = unwrap(self.staging.open_read(source))
        try:
            record = _earlier_record(conn, pool, name)
            if record is not None:
                return answer_again(
                    record,
                    reader,
                    source,
                    expected=expected,
                    name=name,
                    place=f"storage pool {pool_name!r}",
                )
            with self._staged_volume(conn, pool, reader, source, expected) as (staged, digest):
                existing = find_volume(pool, name)
                if existing is None:
                    path = _converted(conn, pool, staged, name)
                else:  # no record: its import was killed before it kept one
                    path = self._earlier_import(conn, pool, staged, existing, pool_name)
        finally:
            reader.close()
        result = ImportResult(
            disk_id=name, path=path, actual_size_bytes=digest.size_bytes, checksum=digest.sha256
        )
        self._keep_record(conn, pool, name, result, made_now=existing is None)
        return result

    def _keep_record(
        self,
        conn: VirConnect,
        pool: VirStoragePool,
        name: str,
        result: ImportResult,
        *,
        made_now: bool,
    ) -> None:
        """The import's answer in a small volume beside the disk; a disk this call made goes
        if its record cannot be kept."""
        record = import_record(result)
        try:
            write_new_volume(
                conn,
                pool,
                volume_xml(f"{name}{RECORD_SUFFIX}", len(record), volume_format="raw"),
                (record,),
                self.host.write_volume,
            )
        except BaseException:
            if made_now:
                delete_volume(conn, result.path)
            raise

    @contextlib.contextmanager
    def _staged_volume(
        self,
        conn: VirConnect,
        pool: VirStoragePool,
        reader: StagedReader,
        source: StagedLocation,
        expected: str | None,
    ) -> Iterator[tuple[str, StagedDigest]]:
        """The staged bytes in a temporary volume of `pool`, checked (format, checksum), with
        their digest; removed when the block ends."""
        progress = TransferProgress(f"import of {source.name!r}", source)
        header, chunks = peek_header(staged_chunks(reader, progress))
        # qcow2, vmdk (sparse, self-contained) or raw; an image that would make the
        # conversion open another file of the host is refused.
        staged_format = disk_format_of(header, field=fields.SOURCE_URL)
        # A raw placeholder of the object's exact size: the upload leaves exactly its bytes,
        # and the pool's refresh reads the format and virtual size back from them.
        size = reader.size_bytes if reader.size_bytes is not None else len(header)
        with self.volumes.temporary(
            conn,
            lambda name: refusing_unsupported(
                "upload",
                lambda: write_new_volume(
                    conn,
                    pool,
                    volume_xml(name, size, volume_format="raw"),
                    chunks,
                    self.host.write_volume,
                ),
            ),
            self.volumes.name("import", staged_format),
        ) as staged:
            digest = reader.digest()
            if expected is not None and digest.sha256 != expected:
                raise checksum_mismatch(digest.sha256, expected)
            landed = volume_facts(conn, staged)
            if landed is None or landed.format != staged_format:
                raise ExpectedError(
                    ProviderError.unsupported(
                        f"storage pool {pool.name()!r} did not recognise the staged "
                        f"{staged_format} image: import into a directory pool"
                    )
                )
            progress.finished(digest)
            yield staged, digest

    def _earlier_import(
        self, conn: VirConnect, pool: VirStoragePool, staged: str, existing: str, pool_name: str
    ) -> str:
        """A disk of that name without a record (its import was killed before keeping one):
        the staged bytes converted again give the same volume (the conversion is
        deterministic) if they made it; other content is a name clash."""
        clash = ProviderError.already_exists(
            f"target_name: storage pool {pool_name!r} already has a volume "
            f"{PurePosixPath(existing).name!r} with other content; delete it or pick another "
            "target_name"
        )
        with self.volumes.temporary(
            conn,
            lambda name: _converted(conn, pool, staged, name),
            self.volumes.name("compare", "qcow2"),
        ) as again:
            try:
                same = _sha256_of(conn, existing) == _sha256_of(conn, again)
            except libvirt.libvirtError as error:  # a driver that cannot download: cannot tell
                raise ExpectedError(clash) from error
        if not same:
            raise ExpectedError(clash)
        return existing


def _exported(digest: StagedDigest) -> ExportResult:
    return ExportResult(
        export_id=f"export-{digest.sha256[:16]}",  # the same bytes, the same answer
        estimated_size_bytes=digest.size_bytes,
        checksum=digest.sha256,
    )


def _earlier_record(conn: VirConnect, pool: VirStoragePool, name: str) -> bytes | None:
    """The record of an earlier import into volume `name` that is still there; the record of
    a volume deleted since is removed."""
    record_path = find_volume(pool, f"{name}{RECORD_SUFFIX}")
    if record_path is None:
        return None
    if find_volume(pool, name) is None:
        delete_volume(conn, record_path)
        return None
    record = conn.storageVolLookupByPath(record_path)
    if int(record.info()[1]) > MAX_RECORD_BYTES:
        return b""  # not one of ours: a clash
    return b"".join(refusing_unsupported("download", lambda: list(volume_chunks(conn, record))))


def _converted(conn: VirConnect, pool: VirStoragePool, staged: str, name: str) -> str:
    """A qcow2 volume `name` holding the staged image's disk, made by libvirt in one call."""
    origin = conn.storageVolLookupByPath(staged)
    capacity = int(origin.info()[1])
    return str(pool.createXMLFrom(volume_xml(name, capacity), origin, 0).path())


def _sha256_of(conn: VirConnect, path: str) -> str:
    digest = hashlib.sha256()
    for chunk in volume_chunks(conn, conn.storageVolLookupByPath(path)):
        digest.update(chunk)
    return digest.hexdigest()


def _file_size(volume: VirStorageVol) -> int | None:
    """The bytes a download of the volume gives (its file's size), when libvirt says."""
    try:
        return int(volume.infoFlags(libvirt.VIR_STORAGE_VOL_GET_PHYSICAL)[2])
    except libvirt.libvirtError:
        return None


def _disk_details(conn: VirConnect, query: DiskQuery) -> DiskDetails:
    guest = Guest.by_id(conn, query.vm_id)
    facts = guest.facts()
    snapshots = tuple(str(snapshot.getName()) for snapshot in guest.dom.listAllSnapshots(0))
    if query.snapshot_id and query.snapshot_id not in snapshots:
        raise ExpectedError(
            ProviderError.not_found(f"VM {facts.name!r} has no snapshot {query.snapshot_id!r}")
        )
    # A VM with no disks has "no disks", whichever disk was asked for.
    chosen = _chosen_disk(facts.name, facts.disks, query.disk_id if facts.disks else "")
    volume = volume_facts(conn, chosen.path)
    return DiskDetails(
        disk_id=chosen.target,
        format=volume.format if volume else chosen.format,
        virtual_size_bytes=volume.capacity_bytes if volume else 0,
        actual_size_bytes=volume.allocation_bytes if volume else 0,
        path=chosen.path,
        is_bootable=chosen == facts.disks[0],
        snapshots=snapshots,
        backing_file=volume.backing_path if volume else "",
        metadata={"vm": facts.name, "target": chosen.target},
    )


def _chosen_disk(vm_name: str, disks: tuple[DiskDevice, ...], disk_id: str) -> DiskDevice:
    """The disk named by target (vda) or path, the root disk when none is named."""
    chosen = next(
        (disk for disk in disks if not disk_id or disk_id in (disk.target, disk.path)), None
    )
    if chosen is None:
        missing = f"no disk {disk_id!r}" if disk_id else "no disks"
        raise ExpectedError(ProviderError.not_found(f"VM {vm_name!r} has {missing}"))
    return chosen
