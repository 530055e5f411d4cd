"""Snapshots on libvirt: internal snapshots inside the VM's qcow2 disks.

Always internal: a running VM's then carries its memory, and reports so. libvirt 9's
disk-only snapshots of a running VM are external overlay files it cannot revert to, and that
would outlive the VM's own volumes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import libvirt
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.context import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.edge import caught, or_none
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code, is_missing
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Snapshot, SnapshotRequest


class LibvirtSnapshots:
    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        return self._host.run(
            f"snapshot {request.vm_id!r}",
            lambda conn: Guest.by_id(conn, request.vm_id).map(
                lambda guest: _create_snapshot(guest, request)
            ),
        )

    def delete_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def delete(conn: VirConnect) -> Result[None, ProviderError]:
            return (
                Guest.by_id(conn, vm_id)
                .bind(lambda guest: find_snapshot(guest, snapshot_id))
                .map(_deleted)
            )

        return self._host.run(f"delete snapshot {snapshot_id!r} of {vm_id!r}", delete)

    def revert_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def revert(guest: Guest) -> Result[None, ProviderError]:
            def reverted(snapshot: Any) -> None:
                guest.dom.revertToSnapshot(snapshot, 0)

            return find_snapshot(guest, snapshot_id).map(reverted)

        return self._host.mutate(
            vm_id,
            f"revert {vm_id!r} to snapshot {snapshot_id!r}",
            lambda conn: Guest.by_id(conn, vm_id).bind(revert),
        )


def find_snapshot(guest: Guest, snapshot_id: str) -> Result[Any, ProviderError]:
    """The VM's snapshot of that name; NOT_FOUND otherwise."""

    def missing(error: libvirt.libvirtError) -> ProviderError | None:
        if is_missing(error) or error_code(error) == libvirt.VIR_ERR_INVALID_ARG:
            return ProviderError.not_found(f"VM {guest.name!r} has no snapshot {snapshot_id!r}")
        return None

    return caught(lambda: Success(guest.dom.snapshotLookupByName(snapshot_id, 0)), missing)


def _deleted(snapshot: Any) -> None:
    snapshot.delete(0)


def _create_snapshot(guest: Guest, request: SnapshotRequest) -> Snapshot:
    dom = guest.dom
    retried = or_none(lambda: _snapshot_value(dom.snapshotLookupByName(request.name, 0)))
    if retried is not None:  # a retry: the same one
        return retried
    return _snapshot_value(dom.snapshotCreateXML(_snapshot_xml(request), 0))


def _snapshot_xml(request: SnapshotRequest) -> str:
    root = ET.Element("domainsnapshot")
    ET.SubElement(root, "name").text = request.name
    if request.description:
        ET.SubElement(root, "description").text = request.description
    return ET.tostring(root, encoding="unicode")


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
