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
from functools import partial
from types import TracebackType
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_raise
from pyrigaud.adapters.hypervisors.vsphere.calls import Faulted, answer, fault_is, transferring
from pyrigaud.adapters.hypervisors.vsphere.nfc_lease import (
    CHUNK_BYTES,
    LeaseProgress,
    abandon_lease,
    ready_lease_info,
    receive_from_lease,
)
from pyrigaud.adapters.hypervisors.vsphere.session import Connection
from pyrigaud.domain.errors import ProviderError

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
            with transferring("downloading a disk through the NFC lease"):
                chunk = self._response.read(CHUNK_BYTES)
            if not chunk:
                return
            self._progress.add(len(chunk))
            yield chunk


def export_disk(
    connection: Connection, source: Any, disk_index: int, holds: contextlib.ExitStack
) -> Result[ExportedDisk, ProviderError]:
    """The disk at `disk_index` among the VM's virtual disks (device order, 0 first) of
    `source`, a vim.VirtualMachine (powered off) or a vim.vm.Snapshot, being read through an
    export lease that `holds` keep: closing them normally completes the lease, with an
    exception (a stopped transfer, a Failure on the way) aborts it. vCenter's faults stay
    faults, for the caller's edge to map."""

    def opened(lease: Any) -> Result[ExportedDisk, ProviderError]:
        return _opened(connection, holds.enter_context(_HeldLease(lease)), source, disk_index)

    return _export_lease(source).bind(opened)


def _opened(
    connection: Connection, held: _HeldLease, source: Any, disk_index: int
) -> Result[ExportedDisk, ProviderError]:
    lease = held.lease
    found = ready_lease_info(connection, lease, ProviderError.unavailable).bind(
        partial(_disk_url, source=source, disk_index=disk_index)
    )
    match found:
        case Success(device):
            pass
        case Failure() as failed:
            return failed
    file_size = int(device.fileSize or 0) or None

    def disk(response: http.client.HTTPResponse) -> ExportedDisk:
        length = _size(response.getheader("Content-Length", ""))
        held.progress = LeaseProgress(lease, file_size or length)
        return ExportedDisk(lease, response, length or file_size, held.progress)

    return receive_from_lease(connection._stub, device.url, held.holds).map(disk)


class _HeldLease:
    """An export lease while its disk is read: completed (the progress told done) when what
    holds it closes normally, aborted otherwise; the GET's connection, in `holds`, closes
    first."""

    def __init__(self, lease: Any) -> None:
        self.lease = lease
        self.progress: LeaseProgress | None = None
        self.holds = contextlib.ExitStack()

    def __enter__(self) -> _HeldLease:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.holds.__exit__(kind, error, trace)
        if kind is not None or self.progress is None:
            abandon_lease(self.lease)
            return
        progress = self.progress

        def completed() -> None:
            progress.report(done=True)
            self.lease.HttpNfcLeaseComplete()

        undone_on_raise(completed, partial(abandon_lease, self.lease))


def _export_lease(source: Any) -> Result[Any, ProviderError]:
    """The export lease of the snapshot or VM; a VM that is not powered off cannot be
    exported (vCenter would have to freeze a running disk): FAILED_PRECONDITION."""
    if isinstance(source, vim.vm.Snapshot):
        return Success(source.ExportSnapshot())
    exported = answer(source.ExportVm, fault_is(vim.fault.InvalidPowerState))
    if not isinstance(exported, Faulted):
        return Success(exported)
    state = POWER_STATES.get(str(exported.fault.existingState), "not powered off")
    return Failure(
        ProviderError.failed_precondition(
            f"VM {source._moId!r} is {state}: power it off, or export from a snapshot (snapshot_id)"
        )
    )


def _disk_url(info: Any, source: Any, disk_index: int) -> Result[Any, ProviderError]:
    """The device URL of the disk at that index: vCenter lists the disks' URLs in device
    order."""
    disks = [url for url in info.deviceUrl or () if url.disk]
    if not 0 <= disk_index < len(disks):
        return Failure(
            ProviderError.not_found(
                f"disk {disk_index} of {source._moId!r} not found: it has {len(disks)} disk(s)"
            )
        )
    return Success(disks[disk_index])


def _size(header: str) -> int | None:
    return int(header) if header.isdigit() else None
