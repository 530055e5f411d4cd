"""DiskTransfer on libvirt: a VM's volume streamed into a file on a mounted PVC, and back.

The manager mounts each migration PVC at `<root>/<pvc>` in the provider's pod, and a
`pvc://<pvc>/<path>` URL names `<root>/<pvc>/<path>` there. The bytes travel on libvirt
streams (virStorageVolDownload / virStorageVolUpload) between libvirt and this process, so the
same code serves a remote host; nothing here runs a program (no qemu-img in the pod).

Export refuses a running (or paused) VM: QEMU writes to its disk, so a copy would not be from
one point in time; power the VM off first. A disk that overlays an image, or a requested
format other than the disk's own, is first copied by libvirt into a standalone volume of that
format in the same pool (flattened and converted on the libvirt host), streamed, then removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import struct
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

import libvirt
from returns.result import Result

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DiskDevice, parse_domain
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    PoolSettings,
    VolumeWriter,
    delete_volume,
    find_pool,
    find_volume,
    volume_facts,
    volume_xml,
    write_new_volume,
)
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import name_problem
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.models import (
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
    TransferBackend,
    TransferMode,
)

MIGRATION_STORAGE_ROOT = "/mnt/migration-storage"
TRANSFER_FORMATS = ("qcow2", "raw")
CHUNK_BYTES = 1024 * 1024
PROGRESS_EVERY_BYTES = 1024**3
QCOW2_MAGIC = b"QFI\xfb"
QCOW2_HEADER = struct.Struct(">4sIQ")  # magic, version, backing file offset
PVC_NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a Kubernetes name
SHA256_PATTERN = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
VirDomain = Any
T = TypeVar("T")

logger = logging.getLogger(__name__)


class LibvirtDiskTransfer:
    """ExportDisk, ImportDisk, and the facts of one disk the manager reads around them."""

    def __init__(self, host: LibvirtHost, migration_storage_root: str) -> None:
        """`migration_storage_root` is where the PVCs of pvc:// URLs are mounted."""
        self._host = host
        self._transfers = PvcTransfers(migration_storage_root, host.pools, host.write_volume)

    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        return self._host.run(
            f"export disk of {request.vm_id!r}",
            lambda conn: self._transfers.export_disk(
                conn, Guest.by_id(conn, request.vm_id).dom, request
            ),
        )

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        return self._host.run(
            "import disk",  # the URL is not echoed before it is checked
            lambda conn: self._transfers.import_disk(conn, request),
        )

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        return self._host.run(
            f"read disk of {query.vm_id!r}", lambda conn: _disk_details(conn, query)
        )


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


@dataclass(frozen=True)
class PvcTransfers:
    """Export and import between libvirt volumes and files under the migration storage root."""

    root: str
    pools: PoolSettings
    write_volume: VolumeWriter

    def export_disk(self, conn: VirConnect, dom: VirDomain, request: ExportRequest) -> ExportResult:
        _refuse_other_transports(request.backend, request.mode)
        if request.compress:
            raise ExpectedError(ProviderError.unsupported("compressed export is not supported"))
        _check_format(request.format)
        if request.snapshot_id:
            raise ExpectedError(
                ProviderError.unsupported(
                    "exporting a snapshot is not supported: revert to it, then export the disk"
                )
            )
        destination = self._resolve(request.destination_url, "destination_url", exists=False)
        facts = parse_domain(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        disk = _chosen_disk(facts.name, facts.disks, request.disk_id)
        if dom.isActive():
            raise ExpectedError(
                ProviderError.failed_precondition(
                    f"VM {facts.name!r} is running (QEMU is writing to its disk): "
                    "power it off first, then export"
                )
            )
        with _standalone_volume(conn, disk.path, request.format, facts.name) as volume:
            checksum, size = _refusing_unsupported(
                "download", lambda: _download(conn, volume, destination, request.destination_url)
            )
        return ExportResult(
            export_id=f"export-{uuid.uuid4().hex}",
            estimated_size_bytes=size,
            checksum=f"sha256:{checksum}",
        )

    def import_disk(self, conn: VirConnect, request: ImportRequest) -> ImportResult:
        _refuse_other_transports(request.backend, request.mode)
        _check_format(request.format)
        expected = _expected_sha256(request) if request.verify_checksum else None
        source = self._resolve(request.source_url, "source_url", exists=True)
        name = f"{_target_name(request.target_name, source)}.{request.format}"
        size = _check_image(source, request.format)
        pool_name = request.storage_hint or self.pools.default_pool
        pool = find_pool(conn, pool_name, self.pools, fields.STORAGE_HINT)
        hashed = _HashedFile(source, request.source_url)
        existing = find_volume(pool, name)
        if existing is not None:
            return self._earlier_import(
                conn, existing, hashed=hashed, expected=expected, size=size, pool_name=pool_name
            )
        # A raw placeholder of the file's exact size: the upload then leaves exactly the file's
        # bytes (a qcow2 placeholder's tail would outlive a shorter upload), and the pool's
        # refresh reads the format and virtual size back from them.
        xml = volume_xml(name, size, volume_format="raw")
        path = _refusing_unsupported(
            "upload",
            lambda: write_new_volume(conn, pool, xml, hashed.chunks(expected), self.write_volume),
        )
        landed = volume_facts(conn, path)
        if landed is None or landed.format != request.format:
            delete_volume(conn, path)
            raise ExpectedError(
                ProviderError.unsupported(
                    f"storage pool {pool_name!r} does not keep {request.format} images "
                    "(it took the upload as raw): import into a directory pool"
                )
            )
        return ImportResult(
            disk_id=name, path=path, actual_size_bytes=size, checksum=f"sha256:{hashed.hexdigest}"
        )

    @staticmethod
    def _earlier_import(
        conn: VirConnect,
        path: str,
        *,
        hashed: _HashedFile,
        expected: str | None,
        size: int,
        pool_name: str,
    ) -> ImportResult:
        """A retried import (its first answer was lost) finds its own volume: the same bytes
        as the file are that import, answered again; other bytes are a name clash."""
        for _ in hashed.chunks(expected):
            pass
        name = Path(path).name
        clash = ProviderError.already_exists(
            f"target_name: storage pool {pool_name!r} already has a volume {name!r} with "
            "other content (an earlier import may have been cut short); delete it or pick "
            "another target_name"
        )
        try:
            volume = conn.storageVolLookupByPath(path)
            stored = hashlib.sha256()
            for chunk in _volume_chunks(conn, volume):
                stored.update(chunk)
        except libvirt.libvirtError as error:  # a driver that cannot download: cannot tell
            raise ExpectedError(clash) from error
        if stored.hexdigest() != hashed.hexdigest:
            raise ExpectedError(clash)
        return ImportResult(
            disk_id=name, path=path, actual_size_bytes=size, checksum=f"sha256:{hashed.hexdigest}"
        )

    def _resolve(self, url: str, field: str, *, exists: bool) -> Path:
        """The file a pvc:// URL names, refused (as an invalid `field`) if it leaves its PVC."""
        parts = urlsplit(url)
        pvc, relative = parts.netloc, parts.path.removeprefix("/")
        if parts.scheme.lower() != "pvc" or parts.query or parts.fragment:
            raise _invalid(field, "must be pvc://<pvc>/<path> with no query or fragment")
        if not PVC_NAME_PATTERN.fullmatch(pvc):
            raise _invalid(field, "the part after pvc:// must be a PVC name")  # never echoed
        segments = relative.split("/")
        if any(segment in ("", ".", "..") or "\0" in segment for segment in segments):
            raise _invalid(field, "the path must be relative, without '.', '..' or empty parts")
        mount = Path(self.root, pvc)
        if not mount.is_dir():
            raise ExpectedError(
                ProviderError.failed_precondition(f"PVC {pvc!r} is not mounted at {mount}")
            )
        real_mount = Path(os.path.realpath(mount))
        target = Path(os.path.realpath(mount.joinpath(*segments)))
        if not real_mount.is_relative_to(os.path.realpath(self.root)) or not (
            target.is_relative_to(real_mount) and target != real_mount
        ):
            raise _invalid(field, "the path leaves its PVC (through a symbolic link)")
        if exists and not target.is_file():
            raise _invalid(field, f"no file at {url}")
        if not exists and target.is_dir():
            raise _invalid(field, f"{url} is a directory")
        return target


def _refuse_other_transports(backend: TransferBackend, mode: TransferMode) -> None:
    if backend is not TransferBackend.PVC:
        raise ExpectedError(
            ProviderError.unsupported(
                f"backend_type {backend.value!r}: libvirt transfers disks to pvc:// only"
            )
        )
    if mode is not TransferMode.RELAY:
        raise ExpectedError(
            ProviderError.unsupported(
                f"transfer_mode {mode.value!r}: libvirt streams through the provider ('relay')"
            )
        )


def _check_format(disk_format: str) -> None:
    if disk_format not in TRANSFER_FORMATS:
        raise ExpectedError(
            ProviderError.unsupported(f"format {disk_format!r}: libvirt transfers qcow2 or raw")
        )


def _invalid(field: str, problem: str) -> ExpectedError:
    return ExpectedError(ProviderError.invalid_spec(field, problem))


def _chosen_disk(vm_name: str, disks: tuple[DiskDevice, ...], disk_id: str) -> DiskDevice:
    """The disk named by target (vda) or path, the root disk when none is named."""
    chosen = next(
        (disk for disk in disks if not disk_id or disk_id in (disk.target, disk.path)), None
    )
    if chosen is None:
        missing = f"no disk {disk_id!r}" if disk_id else "no disks"
        raise ExpectedError(ProviderError.not_found(f"VM {vm_name!r} has {missing}"))
    return chosen


@contextlib.contextmanager
def _standalone_volume(
    conn: VirConnect, path: str, disk_format: str, vm_name: str
) -> Iterator[Any]:
    """The volume at `path` if it is standalone and of `disk_format`, else a temporary copy
    that is (libvirt flattens and converts it on its host), removed afterwards."""
    volume = conn.storageVolLookupByPath(path)
    facts = volume_facts(conn, path)
    if facts is not None and not facts.backing_path and facts.format == disk_format:
        yield volume
        return
    name = f"{vm_name}-export-{secrets.token_hex(4)}.{disk_format}"
    capacity = int(volume.info()[1])
    pool = volume.storagePoolLookupByVolume()
    copy = pool.createXMLFrom(volume_xml(name, capacity, volume_format=disk_format), volume, 0)
    try:
        yield copy
    finally:
        delete_volume(conn, str(copy.path()))


def _download(conn: VirConnect, volume: Any, destination: Path, url: str) -> tuple[str, int]:
    """Stream the volume into `destination` through a temporary file in its directory, so the
    final name only ever holds a complete copy; returns its sha256 and size."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    written = 0
    with tempfile.NamedTemporaryFile(
        dir=destination.parent, prefix=f".{destination.name}.", suffix=".part", delete=False
    ) as partial:
        try:
            for chunk in _volume_chunks(conn, volume):
                partial.write(chunk)
                digest.update(chunk)
                written = _progress(written, len(chunk), "exported", url)
            _sync(partial)
            os.replace(partial.name, destination)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial.name)
            raise
    _sync_directory(destination.parent)
    return digest.hexdigest(), written


def _volume_chunks(conn: VirConnect, volume: Any) -> Iterator[bytes]:
    """The volume's bytes through a libvirt download stream (works on a remote host too)."""
    stream = conn.newStream(0)
    volume.download(stream, 0, 0, 0)
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


def _progress(done: int, more: int, doing: str, url: str) -> int:
    """Bytes so far; a line in the log at every PROGRESS_EVERY_BYTES."""
    total = done + more
    if total // PROGRESS_EVERY_BYTES > done // PROGRESS_EVERY_BYTES:
        logger.info("%s %d MiB so far (%s)", doing, total // 2**20, url)
    return total


def _sync(file: IO[bytes]) -> None:
    file.flush()
    os.fsync(file.fileno())


def _sync_directory(directory: Path) -> None:
    """The rename itself made durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _refusing_unsupported(direction: str, transfer: Callable[[], T]) -> T:
    """A driver without volume streams (libvirt's test driver) gets an honest UNSUPPORTED."""
    try:
        return transfer()
    except libvirt.libvirtError as error:
        if error_code(error) != libvirt.VIR_ERR_NO_SUPPORT:
            raise
        raise ExpectedError(
            ProviderError.unsupported(
                f"this libvirt driver cannot {direction} volumes (virStorageVol"
                f"{direction.capitalize()}): disk transfer needs a real hypervisor"
            )
        ) from error


def _expected_sha256(request: ImportRequest) -> str:
    match = SHA256_PATTERN.fullmatch(request.expected_checksum.strip().lower())
    if match is None:
        raise _invalid("expected_checksum", "must be sha256:<64 hex digits> (or the bare digits)")
    return match.group(1)


def _target_name(target_name: str, source: Path) -> str:
    """The volume's name before its format suffix: as given, else the source file's stem."""
    name = target_name or source.name.removesuffix(".qcow2").removesuffix(".raw")
    problem = name_problem(name)
    if problem is not None:
        raise _invalid("target_name", f"{problem} (it names the imported volume)")
    return name


def _check_image(source: Path, disk_format: str) -> int:
    """The file's size, once it is known to be of `disk_format` and to stand alone: a qcow2
    with a backing file would make the hypervisor open a file of the uploader's choosing."""
    with source.open("rb") as image:
        header = image.read(QCOW2_HEADER.size)
    is_qcow2 = len(header) == QCOW2_HEADER.size and header[:4] == QCOW2_MAGIC
    if disk_format == "qcow2" and not is_qcow2:
        raise _invalid("format", "the file is not a qcow2 image")
    if disk_format == "raw" and is_qcow2:
        raise _invalid("format", "the file is a qcow2 image, not raw")
    if is_qcow2 and QCOW2_HEADER.unpack(header)[2] != 0:
        raise _invalid("source_url", "the qcow2 image has a backing file: flatten it first")
    return source.stat().st_size


class _HashedFile:
    """A file read in chunks, hashed on the way; a wrong checksum fails at the last chunk, so
    the upload it feeds aborts and its volume is removed."""

    def __init__(self, path: Path, url: str) -> None:
        self._path = path
        self._url = url
        self._digest = hashlib.sha256()

    @property
    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def chunks(self, expected: str | None) -> Iterator[bytes]:
        done = 0
        with self._path.open("rb") as image:
            while chunk := image.read(CHUNK_BYTES):
                self._digest.update(chunk)
                done = _progress(done, len(chunk), "imported", self._url)
                yield chunk
        if expected is not None and self.hexdigest != expected:
            raise _invalid(
                "expected_checksum",
                f"the file's sha256 is {self.hexdigest}, not {expected}; nothing was imported",
            )
