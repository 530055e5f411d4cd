"""Snapshots of a VM with pflash (UEFI) firmware: external overlays, reverted and deleted by
pyrigaud, with a copy of the NVRAM.

Why not internal snapshots, as for every other VM (snapshots.py): libvirt 9.0 refuses them
for a running VM with pflash firmware ("internal snapshots of a VM with pflash based firmware
are not supported"), and even where it allows them (a powered-off VM) they leave the NVRAM
out. A qcow2 NVRAM that could hold internal snapshots too needs `<nvram format='qcow2'>`,
which libvirt 9.0 does not know (it drops the attribute and still refuses). So such a VM's
snapshot is an external one (disk-only, or with the memory of a running VM), which libvirt
9.0 makes for a running VM and a powered-off one alike but neither reverts nor deletes (it
learns that in 9.7 and 9.9); pyrigaud does both:

- **Create**: each disk gets an empty qcow2 overlay on its current image, a volume of the
  disk's own pool named `<vm>-<disk>-snap-<token>.qcow2`, made through the pool and recorded
  in the VM's metadata *before* libvirt switches the disk onto it (`REUSE_EXT`), so a crash
  leaves nothing pyrigaud does not own: Delete of the VM removes it. The image under the
  overlay is never written again while the overlay is on it: it *is* the disk at the
  snapshot. A running VM is paused for the switch and for the copy of its NVRAM (nvram.py)
  into `<overlay>.nvram`, so disks and NVRAM are from one instant. Asked for memory, a
  running VM's snapshot has libvirt save it into `<overlay>.memory` (a file libvirt writes
  past the pool, recorded like the overlays); a powered-off VM's is disk-only, reported so.
- **Revert** (to the newest snapshot; an older one while newer ones exist is
  FAILED_PRECONDITION: delete those first): the VM is powered off, each overlay is made
  empty again on its image, the definition is the one the snapshot saved (with the disks on
  the overlays and pyrigaud's current metadata), and the NVRAM copy is put back. A snapshot
  with memory then runs on from it: libvirt restores the saved memory with the saved live
  definition, its disks on the emptied overlays (`virDomainRestoreFlags`, the file kept for
  the next revert). A disk-only one leaves the VM off, as after a power loss at that instant.
- **Delete**: each overlay is block-committed into the image under it (an active commit
  and pivot for the newest, a plain commit for an older one), then removed with its NVRAM
  copy, its memory file and the snapshot's metadata. A powered-off VM is started paused for
  the commit (no guest code runs, the NVRAM is not touched) and stopped again.

A snapshot made before this existed (internal, of a powered-off UEFI VM) is still reverted and
deleted by libvirt.
"""

from __future__ import annotations

import contextlib
import secrets
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.metadata import VMMetadata
from pyrigaud.adapters.hypervisors.libvirt.nvram import (
    copy_nvram,
    forget_nvram_copy,
    restore_nvram,
)
from pyrigaud.adapters.hypervisors.libvirt.overlay_commit import committed
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    create_volume,
    delete_volume,
    planned_volume_path,
    volume_facts,
    volumes_by_path,
)
from pyrigaud.application.ports import Clock
from pyrigaud.domain.errors import ProviderError

VirDomainSnapshot = Any

CREATE_FLAGS = (
    libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REUSE_EXT | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_ATOMIC
)
NVRAM_COPY_SUFFIX = ".nvram"
MEMORY_SUFFIX = ".memory"
QEMU_DRIVER = "QEMU"  # what the connection of libvirt's QEMU driver calls itself


@dataclass(frozen=True)
class Overlay:
    """The file an external snapshot put on top of disk `target`."""

    target: str
    path: str

    @property
    def nvram_copy(self) -> str:
        """Where the snapshot's NVRAM copy is, beside its first overlay."""
        return f"{self.path}{NVRAM_COPY_SUFFIX}"

    @property
    def memory(self) -> str:
        """Where libvirt saves the memory of a snapshot that holds it, beside its first
        overlay."""
        return f"{self.path}{MEMORY_SUFFIX}"


def uses_pflash(conn: VirConnect, guest: Guest) -> bool:
    """Whether QEMU boots the VM's UEFI from pflash, whose internal snapshots libvirt 9
    refuses. libvirt's test driver runs no firmware and keeps no NVRAM (nor does it make
    external snapshots): its VMs' snapshots stay internal."""
    return conn.getType() == QEMU_DRIVER and guest.facts().firmware == "UEFI"


def overlays_of(snapshot: VirDomainSnapshot) -> tuple[Overlay, ...]:
    """The overlays of an external snapshot; () for an internal one."""
    root = ET.fromstring(snapshot.getXMLDesc(0))  # noqa: S314 - libvirt's own output
    return tuple(
        Overlay(target=disk.get("name", ""), path=source.get("file", ""))
        for disk in root.iterfind("disks/disk")
        if disk.get("snapshot") == "external" and (source := disk.find("source")) is not None
    )


def image_at(conn: VirConnect, snapshot: VirDomainSnapshot, target: str) -> str | None:
    """The image holding disk `target` as it was at an external snapshot (the one under its
    overlay, never written since); None for an internal snapshot."""
    for overlay in overlays_of(snapshot):
        if overlay.target == target:
            facts = volume_facts(conn, overlay.path)
            return facts.backing_path if facts is not None else None
    return None


def create_overlay_snapshot(
    conn: VirConnect, guest: Guest, snapshot_xml: ET.Element, *, include_memory: bool
) -> Result[VirDomainSnapshot, ProviderError]:
    """The external snapshot `snapshot_xml` (name and description) of every disk, with the
    NVRAM copied beside it, and the memory of a running VM if asked."""
    facts = guest.facts()
    if not facts.disks:
        return Failure(
            ProviderError.failed_precondition(f"VM {guest.name!r} has no disk to snapshot")
        )
    token = secrets.token_hex(4)
    planned: list[tuple[Any, str, Overlay]] = []
    for disk in facts.disks:
        pool = conn.storageVolLookupByPath(disk.path).storagePoolLookupByVolume()
        name = f"{facts.name}-{disk.target}-snap-{token}.qcow2"
        planned.append((pool, name, Overlay(disk.target, planned_volume_path(pool, name))))
    overlays = tuple(overlay for _, _, overlay in planned)
    memory = overlays[0].memory if include_memory and guest.dom.isActive() else ""
    owned = (*(overlay.path for overlay in overlays), overlays[0].nvram_copy)
    owned += (memory,) if memory else ()
    first_pool = planned[0][0]
    metadata = guest.metadata()
    if metadata is not None:
        guest.write_metadata(metadata.with_volumes((*metadata.volumes, *owned)))

    def made() -> Result[VirDomainSnapshot, ProviderError]:
        for (pool, name, _), disk in zip(planned, facts.disks, strict=True):
            image = volume_facts(conn, disk.path)
            if image is None:
                return Failure(ProviderError.not_found(f"no volume at {disk.path!r}"))
            create_volume(pool, name, image.capacity_bytes, image)
        _describe(snapshot_xml, guest, overlays, memory)
        flags = CREATE_FLAGS | (0 if memory else libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_DISK_ONLY)
        first = overlays[0]
        with _paused(guest):  # the NVRAM first: a failure then leaves the disks untouched
            copy_nvram(conn, guest, first_pool, first.nvram_copy.rsplit("/", 1)[-1])
            snapshot = guest.dom.snapshotCreateXML(
                ET.tostring(snapshot_xml, encoding="unicode"), flags
            )
        if memory:
            first_pool.refresh(0)  # libvirt wrote the memory file past the pool
        return Success(snapshot)

    def undo() -> None:
        if memory:
            first_pool.refresh(0)
        for path in owned:
            delete_volume(conn, path)
        if metadata is not None:
            guest.write_metadata(metadata)

    return undone_on_failure(made, undo)


def revert_overlay_snapshot(
    conn: VirConnect, guest: Guest, snapshot: VirDomainSnapshot
) -> Result[None, ProviderError]:
    overlays = overlays_of(snapshot)

    def not_held(_: None) -> Result[None, ProviderError]:
        return _not_held(conn, guest, overlays)

    def reverted(_: None) -> None:
        _reverted(conn, guest, snapshot, overlays)

    return _newest(guest, snapshot, overlays).bind(not_held).map(reverted)


def _reverted(
    conn: VirConnect, guest: Guest, snapshot: VirDomainSnapshot, overlays: tuple[Overlay, ...]
) -> None:
    metadata = guest.metadata()
    guest.stop()
    for overlay in overlays:
        _emptied(conn, overlay)
    conn.defineXML(_definition_at(snapshot, overlays))
    restore_nvram(conn, guest, _nvram_copy_of(conn, overlays))
    memory = _memory_of(snapshot)
    if memory:  # running again as it ran then, on the emptied overlays
        saved = conn.saveImageGetXMLDesc(memory, libvirt.VIR_DOMAIN_SAVE_IMAGE_XML_SECURE)
        domain = ET.fromstring(saved)  # noqa: S314 - libvirt's own output
        conn.restoreFlags(memory, _on_overlays(domain, overlays), libvirt.VIR_DOMAIN_SAVE_RUNNING)
    if metadata is not None:
        guest.write_metadata(metadata)


def delete_overlay_snapshot(
    conn: VirConnect, guest: Guest, snapshot: VirDomainSnapshot, clock: Clock
) -> Result[None, ProviderError]:
    overlays = overlays_of(snapshot)

    def merged(_: None) -> Result[None, ProviderError]:
        with _running(guest):
            return _merged(conn, guest, overlays, clock)

    def forgotten(_: None) -> None:
        _forgotten(conn, guest, snapshot, overlays)

    return _not_held(conn, guest, overlays).bind(merged).map(forgotten)


def _merged(
    conn: VirConnect, guest: Guest, overlays: tuple[Overlay, ...], clock: Clock
) -> Result[None, ProviderError]:
    """Every overlay committed into the image under it, stopping at the first that fails."""
    for overlay in overlays:
        match _merged_overlay(conn, guest, overlay, clock):
            case Failure() as failed:
                return failed
    return Success(None)


def _merged_overlay(
    conn: VirConnect, guest: Guest, overlay: Overlay, clock: Clock
) -> Result[None, ProviderError]:
    image = volume_facts(conn, overlay.path)
    if image is None or not image.backing_path:
        return Success(None)  # merged and removed by an attempt cut short before
    return committed(guest, overlay.target, overlay.path, image.backing_path, clock)


def _forgotten(
    conn: VirConnect, guest: Guest, snapshot: VirDomainSnapshot, overlays: tuple[Overlay, ...]
) -> None:
    """The merged snapshot's files, its place in the VM's metadata and its own metadata gone.
    Their pools are listed afresh: a newer overlay now rests on another image, which the
    pool learns only from reading its header again."""
    copy = _nvram_copy_of(conn, overlays)
    pools = [_pool_of(conn, overlay.path) for overlay in overlays]
    memory = _memory_of(snapshot)
    if memory:
        delete_volume(conn, memory)
    for overlay in overlays:
        delete_volume(conn, overlay.path)
    for pool in pools:
        if pool is not None:
            pool.refresh(0)
    forget_nvram_copy(conn, copy)
    metadata = guest.metadata()
    if metadata is not None:
        guest.write_metadata(_without(metadata, overlays))
    snapshot.delete(libvirt.VIR_DOMAIN_SNAPSHOT_DELETE_METADATA_ONLY)


def _newest(
    guest: Guest, snapshot: VirDomainSnapshot, overlays: tuple[Overlay, ...]
) -> Result[None, ProviderError]:
    """Refused unless the VM's disks are on the snapshot's overlays (nothing newer on them)."""
    current = {disk.target: disk.path for disk in guest.facts().disks}
    if any(current.get(overlay.target) != overlay.path for overlay in overlays):
        return Failure(
            ProviderError.failed_precondition(
                f"snapshot {snapshot.getName()!r} of VM {guest.name!r} is not its newest: "
                "a UEFI VM reverts only to its newest snapshot; delete the newer ones first"
            )
        )
    return Success(None)


def _not_held(
    conn: VirConnect, guest: Guest, overlays: tuple[Overlay, ...]
) -> Result[None, ProviderError]:
    """Refused while a disk other than the VM's own grew on one of the overlays (a linked
    clone of the VM): emptying or merging it would change what that disk reads."""
    paths = {overlay.path for overlay in overlays}
    own = {disk.path for disk in guest.facts().disks} | {
        overlay.path
        for snapshot in guest.dom.listAllSnapshots(0)
        for overlay in overlays_of(snapshot)
    }
    for volume in volumes_by_path(conn).values():
        if volume.backing_path in paths and volume.path not in own:
            return Failure(
                ProviderError.failed_precondition(
                    f"{volume.path!r} grew on the snapshot's overlay {volume.backing_path!r} "
                    "(a linked clone): delete it first"
                )
            )
    return Success(None)


def _describe(
    snapshot_xml: ET.Element, guest: Guest, overlays: tuple[Overlay, ...], memory: str
) -> None:
    """Every disk onto its overlay, the other drives (a cloud-init seed) left as they are;
    the memory saved into `memory`, if named."""
    memory_attributes = {"snapshot": "external", "file": memory} if memory else {}
    ET.SubElement(snapshot_xml, "memory", memory_attributes or {"snapshot": "no"})
    disks = ET.SubElement(snapshot_xml, "disks")
    by_target = {overlay.target: overlay for overlay in overlays}
    root = ET.fromstring(guest.inactive_xml())  # noqa: S314 - libvirt's own output
    for device in root.iterfind("devices/disk"):
        target = device.find("target")
        name = target.get("dev", "") if target is not None else ""
        overlay = by_target.get(name)
        if overlay is None:
            ET.SubElement(disks, "disk", {"name": name, "snapshot": "no"})
            continue
        element = ET.SubElement(
            disks, "disk", {"name": name, "snapshot": "external", "type": "file"}
        )
        ET.SubElement(element, "driver", {"type": "qcow2"})
        ET.SubElement(element, "source", {"file": overlay.path})


@contextlib.contextmanager
def _paused(guest: Guest) -> Iterator[None]:
    """A running VM held still for the duration (a stopped or paused one as it is)."""
    pause = guest.is_running()
    if pause:
        guest.dom.suspend()
    try:
        yield
    finally:
        if pause:
            guest.dom.resume()


@contextlib.contextmanager
def _running(guest: Guest) -> Iterator[None]:
    """QEMU running the VM for the duration: a powered-off one is started paused (no guest
    code runs) and stopped again after."""
    if guest.dom.isActive():
        yield
        return
    guest.dom.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)
    try:
        yield
    finally:
        guest.dom.destroy()


def _emptied(conn: VirConnect, overlay: Overlay) -> None:
    """The overlay made empty again on the image under it (same volume, same path)."""
    facts = volume_facts(conn, overlay.path)
    if facts is None or not facts.backing_path:
        return
    image = volume_facts(conn, facts.backing_path)
    if image is None:
        return
    volume = conn.storageVolLookupByPath(overlay.path)
    pool = volume.storagePoolLookupByVolume()
    name = str(volume.name())
    volume.delete(0)
    create_volume(pool, name, image.capacity_bytes, image)


def _definition_at(snapshot: VirDomainSnapshot, overlays: tuple[Overlay, ...]) -> str:
    """The VM's definition as the snapshot saved it, its disks on the overlays."""
    root = ET.fromstring(snapshot.getXMLDesc(0))  # noqa: S314 - libvirt's own output
    saved = root.find("inactiveDomain")
    if saved is None:
        saved = root.find("domain")
    if saved is None:
        raise ValueError(f"snapshot {snapshot.getName()!r} holds no domain definition")
    saved.tag = "domain"
    return _on_overlays(saved, overlays)


def _on_overlays(domain: ET.Element, overlays: tuple[Overlay, ...]) -> str:
    """A domain's XML with each snapshotted disk on its overlay (libvirt reads the chain)."""
    by_target = {overlay.target: overlay.path for overlay in overlays}
    for disk in domain.iterfind("devices/disk"):
        target = disk.find("target")
        path = by_target.get(target.get("dev", "") if target is not None else "")
        source = disk.find("source")
        if path is None or source is None:
            continue
        source.set("file", path)
        for backing in disk.findall("backingStore"):
            disk.remove(backing)
    return ET.tostring(domain, encoding="unicode")


def _memory_of(snapshot: VirDomainSnapshot) -> str:
    """The file holding the snapshot's memory; "" for a disk-only one."""
    root = ET.fromstring(snapshot.getXMLDesc(0))  # noqa: S314 - libvirt's own output
    memory = root.find("memory")
    if memory is None or memory.get("snapshot") != "external":
        return ""
    return memory.get("file", "")


def _pool_of(conn: VirConnect, path: str) -> Any:
    """The pool holding the volume at `path`; None when it is gone."""
    if volume_facts(conn, path) is None:
        return None
    return conn.storageVolLookupByPath(path).storagePoolLookupByVolume()


def _nvram_copy_of(conn: VirConnect, overlays: tuple[Overlay, ...]) -> str:
    """The snapshot's NVRAM copy, "" when it has none (the VM had never run)."""
    if not overlays:
        return ""
    copy = overlays[0].nvram_copy
    return copy if volume_facts(conn, copy) is not None else ""


def _without(metadata: VMMetadata, overlays: tuple[Overlay, ...]) -> VMMetadata:
    gone = {
        path for overlay in overlays for path in (overlay.path, overlay.nvram_copy, overlay.memory)
    }
    return metadata.with_volumes(tuple(path for path in metadata.volumes if path not in gone))
