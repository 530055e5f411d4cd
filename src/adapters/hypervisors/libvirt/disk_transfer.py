"""A libvirt VM's disk read at a point in time as a byte stream, and a byte stream landed as a
qcow2 volume: what ExportDisk and ImportDisk ask of libvirt (the transfer itself is theirs).

The bytes travel through libvirt's volume streams (`volume_streams.py`), so no disk is ever held
in memory, the same code serves a remote host over any transport, and nothing runs on the host.

The state at a snapshot (`snapshot_id`, which the manager's sequence always sends: with its
defaults the VM keeps running) is read from the qcow2 file's internal snapshot by qemu-img in
the pod (`snapshot_export.py`), running VM or not: the snapshot's clusters are never written
again, so the guest goes on undisturbed. A UEFI VM's snapshot is an external overlay
(`overlay_snapshots.py`): the disk at it is the image under the overlay, never written since,
read as a powered-off disk is. Without a snapshot a running (or paused) VM is
refused: QEMU writes to its disk, so a copy would not be from one point in time. A disk that
overlays an image, or a requested format other than the disk's own, is first copied by libvirt
into a temporary standalone volume of that format in the same pool (flattened and converted on
the libvirt host), streamed, then removed.

Landing is `disk_landing.py`'s: a keepable qcow2 written in place into the disk's own volume,
any other image held in a temporary volume of the target pool and converted by libvirt into
the final qcow2 volume; the import's record beside it.
"""

from __future__ import annotations

import contextlib
import logging
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO, TypeVar

import libvirt
from returns.converters import flatten
from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.scratch import given_or_scratch
from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.disk_streams import ChunkStream, Make
from pyrigaud.adapters.hypervisors.libvirt.calls import best_effort
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.disk_landing import PoolSite
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DiskDevice, DomainFacts, parse_domain
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest, guest_action
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.overlay_snapshots import image_at
from pyrigaud.adapters.hypervisors.libvirt.snapshot_export import (
    StandaloneVolume,
    snapshot_image,
)
from pyrigaud.adapters.hypervisors.libvirt.snapshots import find_snapshot
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    VolumeFacts,
    find_pool,
    volume_facts,
    volume_made_from,
    volume_xml,
)
from pyrigaud.adapters.hypervisors.libvirt.volume_streams import (
    TransferVolumes,
    VirStorageVol,
    refusing_unsupported,
    volume_chunks,
)
from pyrigaud.application.ports.disk_transfer import DiskStream, LandingSite, TransferWatch
from pyrigaud.domain import fields
from pyrigaud.domain.disk_images import LeftBehind
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskDetails, DiskQuery, DiskRead

EXPORT_FORMATS = ("qcow2", "raw")
IMPORT_FORMATS = ("qcow2", "raw", "vmdk")  # what the staged bytes may be; the volume is qcow2
DISK_SUFFIX = ".qcow2"
# A backing image qemu-img in the pod reads as it is (anything else libvirt flattens first):
# a VM grown from a qcow2 image costs its data, not a raw copy of its whole size.
BACKING_FORMATS_READ_AS_THEY_ARE = ("raw", "qcow2")
VirDomain = Any
T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LibvirtDiskTransfer:
    """DiskReading, DiskLanding and DiskFacts on libvirt, and the sweep of transfer leftovers."""

    host: LibvirtHost
    volumes: TransferVolumes
    # Where a snapshot's export keeps its anonymous scratch files (None: the temp directory).
    scratch_dir: str | None = None

    @property
    def disk_suffix(self) -> str:
        return DISK_SUFFIX

    def read_disk(self, disk: DiskRead, watch: TransferWatch) -> Result[DiskStream, ProviderError]:
        doing = f"export disk of {disk.vm_id!r}"
        return self.host.run(doing, partial(self._opened, _Asked(disk, watch), doing))

    def landing_site(self, stem: str, storage_hint: str) -> Result[LandingSite, ProviderError]:
        pool = storage_hint or self.host.pools.default_pool

        def site(conn: VirConnect) -> Result[LandingSite, ProviderError]:
            landing = PoolSite(self.host, self.volumes, pool, f"{stem}{DISK_SUFFIX}")
            return Result.do(
                landing
                for found in find_pool(conn, pool, self.host.pools, fields.STORAGE_HINT)
                for _ in landing.unfinished(found)
            )

        return self.host.run("import disk", site)

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        return self.host.run(
            f"read disk of {query.vm_id!r}",
            guest_action(query.vm_id, partial(_disk_details, query=query)),
        )

    def sweep_transfer_leftovers(
        self, older_than_seconds: float
    ) -> Result[tuple[str, ...], ProviderError]:
        """This provider's temporary export/import volumes of transfers that died (their
        staged temporaries are the staging storage's to sweep)."""

        def swept(conn: VirConnect) -> Result[tuple[str, ...], ProviderError]:
            return Success(self.volumes.sweep(conn, older_than_seconds))

        return self.host.run("sweep temporary transfer volumes", swept)

    def _opened(
        self, asked: _Asked, doing: str, conn: VirConnect
    ) -> Result[DiskStream, ProviderError]:
        """The stream of the disk asked for, once the VM and the disk are found and checked:
        what it cannot carry refused, a running VM without a snapshot refused."""
        match Guest.by_id(conn, asked.disk.vm_id):
            case Failure() as failed:
                return failed
            case Success(guest):
                pass
        dom = guest.dom
        xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        facts = parse_domain(xml)
        match chosen_disk(facts.name, facts.disks, asked.disk.disk_id):
            case Failure() as failed:
                return failed
            case Success(disk):
                pass
        match _preflight(facts, xml):
            case Failure() as failed:
                return failed
            case Success(left_behind):
                pass
        if dom.isActive() and asked.disk.snapshot_id is None:
            return Failure(
                ProviderError.failed_precondition(
                    f"VM {facts.name!r} is running (QEMU is writing to its disk): power it "
                    "off, or export from a snapshot (snapshot_id)"
                )
            )
        holds = contextlib.ExitStack()
        read = undone_on_failure(partial(self._read, conn, dom, holds, disk, asked), holds.close)

        def downloaded(
            read: Callable[[], Result[bytes, ProviderError]],
        ) -> Result[bytes, ProviderError]:
            return flatten(
                self.host.attempt(doing, partial(refusing_unsupported, "download", read))
            )

        def stream(found: _Read) -> DiskStream:
            return ChunkStream(
                found.chunks, found.size, holds, downloaded, left_behind + found.left_behind
            )

        return read.map(stream)

    def _read(
        self,
        conn: VirConnect,
        dom: VirDomain,
        holds: contextlib.ExitStack,
        disk: DiskDevice,
        asked: _Asked,
    ) -> Result[_Read, ProviderError]:
        """The disk's chunks as asked (at a snapshot, else now), what they hold kept by `holds`.
        At an external snapshot (a UEFI VM's) that is the image under its overlay, as it is."""
        snapshot_id = asked.disk.snapshot_id
        if snapshot_id is None:
            return Success(self._as_it_is(conn, holds, disk.path, asked.disk.format))
        match find_snapshot(Guest(dom), snapshot_id):
            case Failure() as failed:
                return failed
            case Success(snapshot):
                pass
        later = (LeftBehind.LATER_SNAPSHOTS,) if snapshot.numChildren(0) else ()
        image = image_at(conn, snapshot, disk.target)
        read = (
            Success(self._as_it_is(conn, holds, image, asked.disk.format))
            if image
            else self._at_snapshot(conn, holds, disk.path, snapshot_id, asked)
        )
        return read.map(partial(_leaving, later))

    def _as_it_is(
        self, conn: VirConnect, holds: contextlib.ExitStack, path: str, disk_format: str
    ) -> _Read:
        """The image at `path` in `disk_format`, standalone (a copy made by libvirt if not)."""
        volume = holds.enter_context(self._standalone_volume(conn, path, (disk_format,)))
        return _Read(volume_chunks(conn, volume.volume), _file_size(volume.volume))

    def _at_snapshot(
        self,
        conn: VirConnect,
        holds: contextlib.ExitStack,
        path: str,
        snapshot_id: str,
        asked: _Asked,
    ) -> Result[_Read, ProviderError]:
        """The disk at internal snapshot `snapshot_id` in the asked format, as qemu reads it
        (snapshot_export.py), made whole when it is first read: the file's bytes read into the
        pod are counted, and qemu-img stopped, through the asked watch."""
        disk = volume_facts(conn, path)
        if disk is None:
            return Failure(ProviderError.not_found(f"no volume at {path!r}"))
        backing = (
            holds.enter_context(
                self._standalone_volume(conn, disk.backing_path, BACKING_FORMATS_READ_AS_THEY_ARE)
            )
            if disk.backing_path
            else None
        )
        made = partial(
            self._made,
            conn=conn,
            disk=disk,
            snapshot_id=snapshot_id,
            backing=backing,
            asked=asked,
            holds=holds,
        )
        return Success(_Read(made, None))

    def _made(
        self,
        given: BinaryIO | None,
        *,
        conn: VirConnect,
        disk: VolumeFacts,
        snapshot_id: str,
        backing: StandaloneVolume | None,
        asked: _Asked,
        holds: contextlib.ExitStack,
    ) -> Result[BinaryIO, ProviderError]:
        """The image at the snapshot, made in `given` (else in a scratch file `holds` keeps),
        at the edge: it is made when the stream is first read, outside `host.run`."""
        with self.host.edge(f"export of snapshot {snapshot_id!r}") as edge:
            out = given_or_scratch(given, self.scratch_dir, holds)
            imaged = snapshot_image(
                conn,
                disk,
                snapshot_id,
                disk_format=asked.disk.format,
                backing=backing,
                scratch_dir=self.scratch_dir,
                watch=asked.watch,
                files=holds,
                out=out,
            )
            return Result.do(out for _ in imaged)
        return edge.failure

    @contextlib.contextmanager
    def _standalone_volume(
        self, conn: VirConnect, path: str, formats: tuple[str, ...]
    ) -> Iterator[StandaloneVolume]:
        """The volume at `path` if it is standalone and of one of `formats`, else a temporary
        copy of the first that is (libvirt flattens and converts it on its host), removed
        afterwards."""
        volume = conn.storageVolLookupByPath(path)
        facts = volume_facts(conn, path)
        if facts is not None and not facts.backing_path and facts.format in formats:
            yield StandaloneVolume(volume, facts.format)
            return
        capacity = int(volume.info()[1])
        pool = volume.storagePoolLookupByVolume()
        name = self.volumes.name("export", formats[0])
        made = volume_made_from(pool, volume_xml(name, capacity, volume_format=formats[0]), volume)
        with self.volumes.temporary(conn, made) as copy:
            yield StandaloneVolume(conn.storageVolLookupByPath(copy), formats[0])


@dataclass(frozen=True)
class _Asked:
    """The disk asked for, and the watch of the export that asked."""

    disk: DiskRead
    watch: TransferWatch


@dataclass(frozen=True)
class _Read:
    """A disk being read: its chunks (or how its image is made), their size when known, and
    what its reading leaves."""

    chunks: Iterator[bytes] | Make
    size: int | None
    left_behind: tuple[LeftBehind, ...] = ()


def _leaving(left_behind: tuple[LeftBehind, ...], read: _Read) -> _Read:
    """`read`, leaving `left_behind` (later snapshots, which the moved disk does not carry)."""
    return _Read(read.chunks, read.size, left_behind)


def _file_size(volume: VirStorageVol) -> int | None:
    """The bytes a download of the volume gives (its file's size), when libvirt says."""

    def physical_size() -> int:
        return int(volume.infoFlags(libvirt.VIR_STORAGE_VOL_GET_PHYSICAL)[2])

    return best_effort(physical_size)


def _disk_details(
    conn: VirConnect, guest: Guest, query: DiskQuery
) -> Result[DiskDetails, ProviderError]:
    facts = guest.facts()
    snapshots = tuple(str(snapshot.getName()) for snapshot in guest.dom.listAllSnapshots(0))
    if query.snapshot_id and query.snapshot_id not in snapshots:
        return Failure(
            ProviderError.not_found(f"VM {facts.name!r} has no snapshot {query.snapshot_id!r}")
        )
    # A VM with no disks has "no disks", whichever disk was asked for.
    return chosen_disk(facts.name, facts.disks, query.disk_id if facts.disks else "").map(
        partial(_details, conn, facts, snapshots)
    )


def _details(
    conn: VirConnect, facts: DomainFacts, snapshots: tuple[str, ...], chosen: DiskDevice
) -> DiskDetails:
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


def _preflight(facts: DomainFacts, xml: str) -> Result[tuple[LeftBehind, ...], ProviderError]:
    """What the moved disk will not carry; a VM whose passthrough devices a disk cannot take
    along is refused before a byte moves."""
    devices = ET.fromstring(xml).find("devices")  # noqa: S314 - libvirt's own output
    passthrough = sorted(
        {str(device.get("type", "device")) for device in devices.iter("hostdev")}
        if devices is not None
        else set()
    )
    if passthrough:
        return Failure(
            ProviderError.failed_precondition(
                f"VM {facts.name!r} has passthrough devices ({', '.join(passthrough)}): a "
                "moved disk cannot take them along; detach them, then export"
            )
        )
    left: list[LeftBehind] = []
    if len(facts.disks) > 1:
        left.append(LeftBehind.OTHER_DISKS)
    if devices is not None and devices.find("tpm") is not None:
        left.append(LeftBehind.TPM)
    if facts.firmware == "UEFI":
        left.append(LeftBehind.NVRAM)
    return Success(tuple(left))


def chosen_disk(
    vm_name: str, disks: tuple[DiskDevice, ...], disk_id: str
) -> Result[DiskDevice, ProviderError]:
    """The disk named by target (vda) or path, the root disk when none is named."""
    chosen = next(
        (disk for disk in disks if not disk_id or disk_id in (disk.target, disk.path)), None
    )
    if chosen is None:
        missing = f"no disk {disk_id!r}" if disk_id else "no disks"
        return Failure(ProviderError.not_found(f"VM {vm_name!r} has {missing}"))
    return Success(chosen)
