"""vCenter's NFC leases (HttpNfcLease), the way its own clients use them for disk bytes: wait
until the lease is ready, move each disk's bytes over HTTP to or from the device URL with the
session's cookie and TLS settings, tell the lease the progress (an idle lease expires), and
complete or abort it.

What vCenter says in words (a lease in error, an HTTP status) is a Failure; what the network
raises while bytes move stays an exception (naming the transfer) for the package's edge.
"""

from __future__ import annotations

import contextlib
import http.client
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import best_effort, transferring
from pyrigaud.adapters.hypervisors.vsphere.errors import fault_message
from pyrigaud.adapters.hypervisors.vsphere.session import Connection
from pyrigaud.adapters.hypervisors.vsphere.tasks import destroyed
from pyrigaud.adapters.hypervisors.vsphere.vcenter_http import opened_request
from pyrigaud.domain.errors import ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

CHUNK_BYTES = 1024 * 1024
LEASE_POLL_SECONDS = 0.2
LEASE_READY_SECONDS = 300.0
PROGRESS_EVERY_SECONDS = 5.0


def ready_lease_info(
    connection: Connection,
    lease: Any,
    failed: Callable[[str], ProviderError],
) -> Result[Any, ProviderError]:
    """The lease's info once it is ready (its device URLs), polled by the connection's clock;
    a lease in error is its fault, as the `failed` kind of error."""
    clock = connection.clock
    deadline = clock.now() + LEASE_READY_SECONDS
    while True:
        state = lease.state
        if state == vim.HttpNfcLease.State.ready:
            return Success(lease.info)
        if state == vim.HttpNfcLease.State.error:
            return Failure(failed(fault_message(lease.error)))
        if clock.now() > deadline:
            return Failure(ProviderError.unavailable("the NFC lease never became ready"))
        clock.sleep(LEASE_POLL_SECONDS)


def send_to_lease(
    stub: Any, url: str, *, create: bool, size: int, reader: Any, progress: LeaseProgress
) -> Result[None, ProviderError]:
    """PUT (a new file) or POST the bytes to the lease URL, over the session's TLS settings."""
    doing = "uploading a disk through the NFC lease"
    headers = {"Content-Type": "application/x-vnd.vmware-streamVmdk", "Content-Length": str(size)}

    method = "PUT" if create else "POST"
    with transferring(doing), opened_request(stub, method, url, headers) as connection:
        while chunk := reader.read(CHUNK_BYTES):
            connection.send(chunk)
            progress.add(len(chunk))
        response = connection.getresponse()
        response.read()
    return _checked_status(response, doing).map(_accepted)


def receive_from_lease(
    stub: Any, url: str, holds: contextlib.ExitStack
) -> Result[http.client.HTTPResponse, ProviderError]:
    """GET the lease URL over the session's TLS settings: the response, its status checked
    and its body still to read (what fails while reading it is a `transferring` too); the
    connection is closed when `holds` close."""
    doing = "downloading a disk through the NFC lease"

    with transferring(doing):
        response = holds.enter_context(opened_request(stub, "GET", url, {})).getresponse()
    return _checked_status(response, doing)


def _accepted(_response: http.client.HTTPResponse) -> None:
    return None


def _checked_status(
    response: http.client.HTTPResponse, doing: str
) -> Result[http.client.HTTPResponse, ProviderError]:
    if not 200 <= response.status < 300:
        return Failure(ProviderError.unavailable(f"{doing}: HTTP {response.status}"))
    return Success(response)


class LeaseProgress:
    """Percent of the bytes moved, told to the lease every few seconds: an idle lease expires.
    With no total known, the percent stays 0 until done (the report still keeps it alive)."""

    def __init__(self, lease: Any, total: int | None) -> None:
        self._lease = lease
        self._total = total
        self._sent = 0
        self._told = time.monotonic()

    def add(self, count: int) -> None:
        self._sent += count
        if time.monotonic() - self._told >= PROGRESS_EVERY_SECONDS:
            self.report()

    def report(self, *, done: bool = False) -> None:
        moved = min(99, self._sent * 100 // self._total) if self._total else 0
        self._lease.HttpNfcLeaseProgress(100 if done else moved)
        self._told = time.monotonic()


def abandon_lease(lease: Any) -> None:
    """Abort the lease, if vCenter has not already ended it; the caller's failure is the one
    reported."""
    best_effort(lease.HttpNfcLeaseAbort)


def abort_lease(connection: Connection, lease: Any) -> None:
    """Abort an import lease and destroy the VM it made, if vCenter has not already; the
    caller's failure is the one reported (so this cleanup's own is not)."""
    entity = best_effort(partial(_made_vm, lease))
    abandon_lease(lease)
    if entity is not None:
        best_effort(partial(destroyed, connection, entity))


def _made_vm(lease: Any) -> Any:
    """The VM an import lease made, once it made one."""
    return lease.info.entity if lease.info is not None else None
