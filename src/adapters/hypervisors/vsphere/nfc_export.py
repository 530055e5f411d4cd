"""A VM's disk read out of vCenter the way its own clients export one: an NFC export lease
(`VirtualMachine.ExportVm` for the current state of a powered-off VM,
`VirtualMachineSnapshot.ExportSnapshot` for the state at a snapshot), then a GET of the
lease's device URL, which serves the disk as one streamOptimized VMDK.

Why the lease and not the datastore's file access: the lease serves one self-contained,
compressed file whatever the datastore layout (flat or sparse extents, the delta chains of
linked clones and snapshots, vSAN or vVol disks whose data is no plain datastore file), held
still while the lease lasts (vCenter blocks power-on, destroy and migration), and it needs only
the VApp.Export privilege, not browse and read rights on every datastore the chain touches.
"""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Iterator
from typing import Any

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.nfc_lease import (
    CHUNK_BYTES,
    LeaseProgress,
    abandon_lease,
    ready_lease_info,
    receiving_from_lease,
    transfer_failed,
)
from pyrigaud.domain.errors import ExpectedError, ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

POWER_STATES = {"poweredOn": "powered on", "suspended": "suspended"}


class ExportedDisk:
    """One disk of an export lease while it is held: its size when vCenter tells it (the
    GET's Content-Length, else the device URL's fileSize) and its streamOptimized bytes."""

    def __init__(
        self,
        lease: Any,
        response: http.client.HTTPResponse,
        size_bytes: int | None,
        progress: LeaseProgress,
    ) -> None:
        self.lease = lease  # the HttpNfcLease: its state says how the export ended
        self.size_bytes = size_bytes
        self._response = response
        self._progress = progress

    def chunks(self) -> Iterator[bytes]:
        """The VMDK's bytes as they arrive, at most CHUNK_BYTES at a time (memory stays
        bounded); the lease hears the progress every few seconds, which keeps it alive."""
        while True:
            try:
                chunk = self._response.read(CHUNK_BYTES)
            except (OSError, http.client.HTTPException) as error:
                raise transfer_failed("downloading a disk through the NFC lease", error) from error
            if not chunk:
                return
            self._progress.add(len(chunk))
            yield chunk


@contextlib.contextmanager
def exported_disk(instance: Any, source: Any, disk_index: int) -> Iterator[ExportedDisk]:
    """The disk at `disk_index` among the VM's virtual disks (device order, 0 first) of
    `source`, a vim.VirtualMachine (powered off) or a vim.vm.Snapshot, being read through an
    export lease. Leaving normally completes the lease; an exception aborts it, and that
    exception is the one that propagates (vCenter faults other than those mapped here stay
    faults, for the caller's `run` to map)."""
    lease = _export_lease(source)
    try:
        info = ready_lease_info(lease, ProviderError.unavailable)
        device = _disk_url(info, source, disk_index)
        file_size = int(device.fileSize or 0) or None
        with receiving_from_lease(instance._stub, device.url) as response:
            length = response.getheader("Content-Length", "")
            progress = LeaseProgress(lease, file_size or _size(length))
            yield ExportedDisk(lease, response, _size(length) or file_size, progress)
        progress.report(done=True)
        lease.HttpNfcLeaseComplete()
    except BaseException:
        abandon_lease(lease)
        raise


def _export_lease(source: Any) -> Any:
    """The export lease of the snapshot or VM; a VM that is not powered off cannot be
    exported (vCenter would have to freeze a running disk): FAILED_PRECONDITION."""
    if isinstance(source, vim.vm.Snapshot):
        return source.ExportSnapshot()
    try:
        return source.ExportVm()
    except vim.fault.InvalidPowerState as fault:
        state = POWER_STATES.get(str(fault.existingState), "not powered off")
        raise ExpectedError(
            ProviderError.failed_precondition(
                f"VM {source._moId!r} is {state}: power it off, or export from a snapshot "
                "(snapshot_id)"
            )
        ) from fault


def _disk_url(info: Any, source: Any, disk_index: int) -> Any:
    """The device URL of the disk at that index: vCenter lists the disks' URLs in device
    order."""
    disks = [url for url in info.deviceUrl or () if url.disk]
    if not 0 <= disk_index < len(disks):
        raise ExpectedError(
            ProviderError.not_found(
                f"disk {disk_index} of {source._moId!r} not found: it has {len(disks)} disk(s)"
            )
        )
    return disks[disk_index]


def _size(header: str) -> int | None:
    return int(header) if header.isdigit() else None
