"""Storage pools and volumes: where VM disks, seeds and prepared images are made and removed.

Bytes reach a volume through a libvirt stream (`upload_volume`), so the same code works on a
remote host; the test driver cannot upload and answers VIR_ERR_NO_SUPPORT.
"""

from __future__ import annotations

import contextlib
import secrets
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_raise
from pyrigaud.adapters.hypervisors.libvirt.calls import (
    ANY_CODE,
    Refused,
    answer,
    best_effort,
    or_none,
    refusal,
)
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.pool_jobs import building_in, refreshing
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError

GIB = 1024**3
# The transient pools pyrigaud starts over libvirt's NVRAM directory (nvram.py): no VM disk
# lies there, so a listing of every disk skips them (a host's NVRAM files are many).
NVRAM_POOL_PREFIX = "pyrigaud-nvram-"
VirStoragePool = Any
VirStorageVol = Any
# Writes the chunks into the volume, replacing its content: the stream upload in production.
VolumeWriter = Callable[[VirConnect, VirStorageVol, Iterable[bytes]], None]


@dataclass(frozen=True)
class VolumeFacts:
    path: str
    format: str
    capacity_bytes: int
    allocation_bytes: int
    backing_path: str


@dataclass(frozen=True)
class PoolSettings:
    """Which pool VMs land in when no placement names one, and where it goes if missing."""

    default_pool: str = "default"
    default_pool_path: str = "/var/lib/libvirt/images"


def find_pool(
    conn: VirConnect, name: str, settings: PoolSettings, field: str = fields.PLACEMENT_DATASTORE
) -> Result[VirStoragePool, ProviderError]:
    """The named pool, active; only the default pool is created when it does not exist.

    A missing named pool is an invalid spec of `field`, the request field that named it.
    """
    pool = _pool_named(conn, name)
    if pool is None:
        if name != settings.default_pool:
            return Failure(ProviderError.invalid_spec(field, f"no storage pool named {name!r}"))
        pool = _default_pool_made(conn, settings)
    if not pool.isActive():
        # Another call (or replica) may start it at the same moment: started is started.
        refusal(
            partial(pool.create, 0),
            (libvirt.VIR_ERR_OPERATION_INVALID,),
            unless=lambda: not pool.isActive(),
        )
    return Success(pool)


def _default_pool_made(conn: VirConnect, settings: PoolSettings) -> VirStoragePool:
    """The default pool defined, built and started with the host. Another call (or replica)
    defining it at the same moment makes libvirt refuse this one ("already exists"): its pool
    is the one, built here too unless it already started (building a directory pool again
    changes nothing; libvirt refuses to build an active one)."""
    name = settings.default_pool
    defined = answer(
        partial(conn.storagePoolDefineXML, _dir_pool_xml(name, settings.default_pool_path), 0),
        (libvirt.VIR_ERR_OPERATION_FAILED,),
        unless=lambda: _pool_named(conn, name) is None,
    )
    pool = conn.storagePoolLookupByName(name) if isinstance(defined, Refused) else defined
    refusal(
        partial(pool.build, 0),
        (libvirt.VIR_ERR_OPERATION_INVALID,),
        unless=lambda: not pool.isActive(),
    )
    pool.setAutostart(1)
    return pool


def _pool_named(conn: VirConnect, name: str) -> VirStoragePool | None:
    return or_none(partial(conn.storagePoolLookupByName, name))


def _dir_pool_xml(name: str, path: str) -> str:
    root = ET.Element("pool", {"type": "dir"})
    ET.SubElement(root, "name").text = name
    ET.SubElement(ET.SubElement(root, "target"), "path").text = path
    return ET.tostring(root, encoding="unicode")


def volume_name(vm_name: str, index: int) -> str:
    """Unique per attempt, so a crashed Create's leftover never blocks the retry."""
    return f"{vm_name}-disk{index}-{secrets.token_hex(4)}.qcow2"


def seed_volume_name(vm_name: str) -> str:
    return f"{vm_name}-cidata-{secrets.token_hex(4)}.iso"


def volume_xml(
    name: str,
    capacity_bytes: int,
    backing: VolumeFacts | None = None,
    *,
    volume_format: str = "qcow2",
) -> str:
    """A thin volume (qcow2 unless told), optionally an overlay on `backing`. A qcow2 is
    version 3 (compat 1.1), as qemu-img makes by default: without it libvirt asks for
    version 2, which has no zero clusters (a guest's zeroing and discards allocate, and a
    copy of a 2 GiB disk took ten times as long)."""
    root = ET.Element("volume")
    ET.SubElement(root, "name").text = name
    ET.SubElement(root, "capacity", {"unit": "bytes"}).text = str(capacity_bytes)
    ET.SubElement(root, "allocation", {"unit": "bytes"}).text = "0"
    target = ET.SubElement(root, "target")
    ET.SubElement(target, "format", {"type": volume_format})
    if volume_format == "qcow2":
        ET.SubElement(target, "compat").text = "1.1"
    if backing is not None:
        store = ET.SubElement(root, "backingStore")
        ET.SubElement(store, "path").text = backing.path
        ET.SubElement(store, "format", {"type": backing.format})
    return ET.tostring(root, encoding="unicode")


def planned_volume_path(pool: VirStoragePool, name: str) -> str:
    """Where `pool` will put a volume called `name`: its target directory (or device) + name.

    True for directory, filesystem, NFS and LVM pools, the kinds pyrigaud makes VMs in; a
    Create records these paths before it makes anything, so a crash leaves nothing unnamed.
    """
    root = ET.fromstring(pool.XMLDesc(0))  # noqa: S314 - libvirt's own output
    return f"{root.findtext('target/path', '').rstrip('/')}/{name}"


def create_volume(
    pool: VirStoragePool, name: str, capacity_bytes: int, backing: VolumeFacts | None = None
) -> str:
    return str(made_volume(pool, volume_xml(name, capacity_bytes, backing)).path())


def made_volume(pool: VirStoragePool, xml: str) -> VirStorageVol:
    """A volume of `pool` made from `xml` (a build: no refresh of the pool meanwhile)."""
    with building_in(pool):
        return pool.createXML(xml, 0)


def volume_made_from(pool: VirStoragePool, xml: str, origin: VirStorageVol) -> str:
    """The path of a volume of `pool` made from `xml` with `origin`'s disk, converted by
    libvirt on its host as the pool's view of `origin` says (a build: no refresh of the pool
    meanwhile)."""
    with building_in(pool):
        return str(pool.createXMLFrom(xml, origin, 0).path())


@contextlib.contextmanager
def refreshed_view(pool: VirStoragePool) -> Iterator[bool]:
    """Whether `pool` was refreshed, with no build of this process in it under way (see
    pool_jobs.py); while the block runs, no refresh of this process changes what it reads.
    False: libvirt refused (another client's build is under way, or the pool stopped)."""
    with refreshing(pool):
        yield refusal(partial(pool.refresh, 0), ANY_CODE) is None


def refresh_pool(pool: VirStoragePool) -> bool:
    """`refreshed_view` with nothing read under it: at best, for a view that may lag."""
    with refreshed_view(pool) as fresh:
        return fresh


def copy_volume(conn: VirConnect, source_path: str, name: str) -> str:
    """A full copy of the volume at `source_path`, in the same pool."""
    source = conn.storageVolLookupByPath(source_path)
    pool = source.storagePoolLookupByVolume()
    capacity = int(source.info()[1])
    return volume_made_from(pool, volume_xml(name, capacity), source)


def upload_volume(conn: VirConnect, volume: VirStorageVol, chunks: Iterable[bytes]) -> None:
    """Stream the chunks into the volume from offset 0; an error part-way aborts the stream."""
    stream = conn.newStream(0)
    with building_in(volume.storagePoolLookupByVolume()):  # libvirtd counts its start as a job
        volume.upload(stream, 0, 0, 0)  # length 0: up to the end of what is sent

    def sent() -> None:
        for chunk in chunks:
            _send_all(stream, chunk)
        stream.finish()

    undone_on_raise(sent, partial(best_effort, stream.abort))


def _send_all(stream: Any, chunk: bytes) -> None:
    """A blocking stream may take part of a chunk per call: send until all of it is gone."""
    view = memoryview(chunk)
    while view:
        sent = int(stream.send(view.tobytes()))
        if sent <= 0:
            raise libvirt.libvirtError("the libvirt stream accepted no data")
        view = view[sent:]


def write_new_volume(
    conn: VirConnect,
    pool: VirStoragePool,
    xml: str,
    chunks: Iterable[bytes],
    writer: VolumeWriter,
    *,
    read_back: bool = True,
) -> str:
    """A volume created from `xml` and filled with the chunks; on any failure, no volume.
    `read_back`: the pool refreshed after (at best), so that its view of the volume tells the
    uploaded image's format and size; a caller that needs that view for sure refreshes
    itself (`refreshed_view`)."""
    volume = made_volume(pool, xml)
    path = str(volume.path())

    def written() -> None:
        writer(conn, volume, chunks)
        if read_back:
            refresh_pool(pool)

    undone_on_raise(written, partial(delete_volume, conn, path))
    return path


def find_volume(pool: VirStoragePool, name: str) -> str | None:
    """The path of the pool's volume called `name`, or None."""

    def path() -> str:
        return str(pool.storageVolLookupByName(name).path())

    return or_none(path)


def copy_volume_into(
    conn: VirConnect, pool: VirStoragePool, source_path: str, name: str
) -> Result[str, ProviderError]:
    """A full copy of the volume at `source_path` in `pool`, keeping its format."""
    source = volume_facts(conn, source_path)
    if source is None:
        return Failure(ProviderError.not_found(f"no volume at {source_path!r}"))
    xml = volume_xml(name, source.capacity_bytes, volume_format=source.format)
    origin = conn.storageVolLookupByPath(source_path)
    return Success(volume_made_from(pool, xml, origin))


def volume_facts(conn: VirConnect, path: str) -> VolumeFacts | None:
    """The volume at `path`, or None when no pool knows it."""
    volume = or_none(partial(conn.storageVolLookupByPath, path))
    if volume is None:
        return None
    _kind, capacity, allocation = volume.info()
    root = ET.fromstring(volume.XMLDesc(0))  # noqa: S314 - libvirt's own output
    target_format = root.find("target/format")
    return VolumeFacts(
        path=path,
        format=target_format.get("type", "raw") if target_format is not None else "raw",
        capacity_bytes=int(capacity),
        allocation_bytes=int(allocation),
        backing_path=root.findtext("backingStore/path", ""),
    )


def volumes_by_path(conn: VirConnect) -> dict[str, VolumeFacts]:
    """Every volume of every active pool (but pyrigaud's NVRAM pools), by path: what
    `volume_facts` finds, in bulk.

    One listing per pool and one XML per volume, instead of a lookup, an info and an XML per
    disk; a pool or volume that vanishes meanwhile is simply not there.
    """
    found: dict[str, VolumeFacts] = {}
    for pool in conn.listAllStoragePools(libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE):
        if str(pool.name()).startswith(NVRAM_POOL_PREFIX):
            continue
        volumes = or_none(partial(pool.listAllVolumes, 0))
        for volume in volumes or ():
            xml = or_none(partial(volume.XMLDesc, 0))
            if xml is None:
                continue
            root = ET.fromstring(xml)  # noqa: S314 - libvirt's own output
            path = root.findtext("target/path", "")
            target_format = root.find("target/format")
            found.setdefault(
                path,
                VolumeFacts(
                    path=path,
                    format=target_format.get("type", "raw") if target_format is not None else "raw",
                    capacity_bytes=int(root.findtext("capacity", "0")),
                    allocation_bytes=int(root.findtext("allocation", "0")),
                    backing_path=root.findtext("backingStore/path", ""),
                ),
            )
    return found


def grow_volume(conn: VirConnect, path: str, capacity_bytes: int) -> None:
    conn.storageVolLookupByPath(path).resize(capacity_bytes, 0)


def delete_volume(conn: VirConnect, path: str) -> None:
    """Remove the volume at `path`; one that is already gone is fine."""

    def delete() -> None:
        conn.storageVolLookupByPath(path).delete(0)

    or_none(delete)  # one already gone: fine
