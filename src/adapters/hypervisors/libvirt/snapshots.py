"""Snapshots on libvirt: internal snapshots inside the VM's qcow2 disks.

Always internal: a running VM's then carries its memory, and reports so. libvirt 9's
disk-only snapshots of a running VM are external overlay files it cannot revert to, and that
would outlive the VM's own volumes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import libvirt
from returns.result import Result

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code, is_missing
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.models import Snapshot, SnapshotRequest


class LibvirtSnapshots:
    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        return self._host.run(
            f"snapshot {request.vm_id!r}", lambda conn: _create_snapshot(conn, request)
        )

    def delete_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def delete(conn: VirConnect) -> None:
            find_snapshot(Guest.by_id(conn, vm_id), snapshot_id).delete(0)

        return self._host.run(f"delete snapshot {snapshot_id!r} of {vm_id!r}", delete)

    def revert_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        def revert(conn: VirConnect) -> None:
            guest = Guest.by_id(conn, vm_id)
            guest.dom.revertToSnapshot(find_snapshot(guest, snapshot_id), 0)

        return self._host.mutate(vm_id, f"revert {vm_id!r} to snapshot {snapshot_id!r}", revert)


def find_snapshot(guest: Guest, snapshot_id: str) -> Any:
    """The VM's snapshot of that name; NOT_FOUND otherwise."""
    try:
        return guest.dom.snapshotLookupByName(snapshot_id, 0)
    except libvirt.libvirtError as error:
        if is_missing(error) or error_code(error) == libvirt.VIR_ERR_INVALID_ARG:
            raise ExpectedError(
                ProviderError.not_found(f"VM {guest.name!r} has no snapshot {snapshot_id!r}")
            ) from error
        raise


def _create_snapshot(conn: VirConnect, request: SnapshotRequest) -> Snapshot:
    dom = Guest.by_id(conn, request.vm_id).dom
    try:
        return _snapshot_value(dom.snapshotLookupByName(request.name, 0))  # a retry: same one
    except libvirt.libvirtError as error:
        if not is_missing(error):
            raise
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
