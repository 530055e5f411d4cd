"""Snapshots on libvirt: internal snapshots inside the VM's qcow2 disks, except for a VM with
pflash (UEFI) firmware.

Internal for every other VM: a running VM's then carries its memory, and reports so.
libvirt 9's external snapshots of a running VM are overlay files it can neither revert to nor
delete. A VM with pflash firmware gets exactly those all the same (libvirt 9.0 refuses its
internal snapshots while it runs, and leaves its NVRAM out of them when it does not), reverted
and deleted by pyrigaud with its NVRAM: overlay_snapshots.py. Revert and delete follow what
the snapshot is, so an internal snapshot a UEFI VM took while powered off, before that, is
still libvirt's.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from functools import partial
from typing import Any

import libvirt
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import caught, or_none
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code, is_missing
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest, guest_action
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.overlay_snapshots import (
    create_overlay_snapshot,
    delete_overlay_snapshot,
    overlays_of,
    revert_overlay_snapshot,
    uses_pflash,
)
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Snapshot, SnapshotRequest


class LibvirtSnapshots:
    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        return self._host.mutate(
            request.vm_id,
            f"snapshot {request.vm_id!r}",
            guest_action(request.vm_id, partial(_create_snapshot, request=request)),
        )

    def delete_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def deleted(conn: VirConnect, guest: Guest, snapshot: Any) -> Result[None, ProviderError]:
            if overlays_of(snapshot):
                return delete_overlay_snapshot(conn, guest, snapshot, self._host.clock)
            snapshot.delete(0)
            return Success(None)

        doing = f"delete snapshot {snapshot_id!r} of {vm_id!r}"
        return self._on_snapshot(vm_id, snapshot_id, doing, deleted)

    def revert_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def reverted(conn: VirConnect, guest: Guest, snapshot: Any) -> Result[None, ProviderError]:
            if overlays_of(snapshot):
                return revert_overlay_snapshot(conn, guest, snapshot)
            guest.dom.revertToSnapshot(snapshot, 0)
            return Success(None)

        doing = f"revert {vm_id!r} to snapshot {snapshot_id!r}"
        return self._on_snapshot(vm_id, snapshot_id, doing, reverted)

    def _on_snapshot(
        self,
        vm_id: str,
        snapshot_id: str,
        doing: str,
        act: Callable[[VirConnect, Guest, Any], Result[None, ProviderError]],
    ) -> Result[None, ProviderError]:
        """`act` on the VM's snapshot of that name (an internal one, or pyrigaud's overlays),
        as one mutation of the VM."""

        def on_snapshot(conn: VirConnect, guest: Guest) -> Result[None, ProviderError]:
            return find_snapshot(guest, snapshot_id).bind(partial(act, conn, guest))

        return self._host.mutate(vm_id, doing, guest_action(vm_id, on_snapshot))


def find_snapshot(guest: Guest, snapshot_id: str) -> Result[Any, ProviderError]:
    """The VM's snapshot of that name; NOT_FOUND otherwise."""

    def missing(error: libvirt.libvirtError) -> ProviderError | None:
        if is_missing(error) or error_code(error) == libvirt.VIR_ERR_INVALID_ARG:
            return ProviderError.not_found(f"VM {guest.name!r} has no snapshot {snapshot_id!r}")
        return None

    def found() -> Result[Any, ProviderError]:
        return Success(guest.dom.snapshotLookupByName(snapshot_id, 0))

    return caught(found, missing)


def _create_snapshot(
    conn: VirConnect, guest: Guest, request: SnapshotRequest
) -> Result[Snapshot, ProviderError]:
    dom = guest.dom

    def made_before() -> Snapshot:
        return _snapshot_value(dom.snapshotLookupByName(request.name, 0))

    retried = or_none(made_before)
    if retried is not None:  # a retry: the same one
        return Success(retried)
    if uses_pflash(conn, guest):
        made = create_overlay_snapshot(
            conn, guest, _snapshot_xml(request), include_memory=request.include_memory
        )
        return made.map(_snapshot_value)
    xml = ET.tostring(_snapshot_xml(request), encoding="unicode")
    return Success(_snapshot_value(dom.snapshotCreateXML(xml, 0)))


def _snapshot_xml(request: SnapshotRequest) -> ET.Element:
    root = ET.Element("domainsnapshot")
    ET.SubElement(root, "name").text = request.name
    if request.description:
        ET.SubElement(root, "description").text = request.description
    return root


def _snapshot_value(snapshot: Any) -> Snapshot:
    root = ET.fromstring(snapshot.getXMLDesc(0))  # noqa: S314 - libvirt's own output
    memory = root.find("memory")
    captured = memory is not None and memory.get("snapshot", "no") != "no"
    return Snapshot(
        id=str(snapshot.getName()),
        name=str(snapshot.getName()),
        description=root.findtext("description", ""),
        include_memory=captured,
    )
