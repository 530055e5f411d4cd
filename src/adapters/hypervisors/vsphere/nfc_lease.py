"""vCenter's NFC leases (HttpNfcLease), the way its own clients use them for disk bytes: wait
until the lease is ready, move each disk's bytes over HTTP to or from the device URL with the
session's cookie and TLS settings, tell the lease the progress (an idle lease expires), and
complete or abort it.
"""

from __future__ import annotations

import contextlib
import http.client
import time
from typing import Any

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.errors import EXPECTED_FAILURES, fault_message
from pyrigaud.adapters.hypervisors.vsphere.tasks import wait
from pyrigaud.adapters.hypervisors.vsphere.vcenter_http import open_request
from pyrigaud.domain.errors import ExpectedError, ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

CHUNK_BYTES = 1024 * 1024
LEASE_POLL_SECONDS = 0.2
LEASE_READY_SECONDS = 300.0
PROGRESS_EVERY_SECONDS = 5.0


def ready_lease_info(lease: Any) -> Any:
    """The lease's info once it is ready (its device URLs); a lease in error is its fault."""
    deadline = time.monotonic() + LEASE_READY_SECONDS
    while True:
        state = lease.state
        if state == vim.HttpNfcLease.State.ready:
            return lease.info
        if state == vim.HttpNfcLease.State.error:
            raise ExpectedError(ProviderError.internal(fault_message(lease.error)))
        if time.monotonic() > deadline:
            raise ExpectedError(ProviderError.unavailable("the NFC lease never became ready"))
        time.sleep(LEASE_POLL_SECONDS)


def send_to_lease(
    stub: Any, url: str, *, create: bool, size: int, reader: Any, progress: LeaseProgress
) -> None:
    """PUT (a new file) or POST the bytes to the lease URL, over the session's TLS settings."""
    try:
        connection = open_request(
            stub,
            "PUT" if create else "POST",
            url,
            {"Content-Type": "application/x-vnd.vmware-streamVmdk", "Content-Length": str(size)},
        )
        try:
            while chunk := reader.read(CHUNK_BYTES):
                connection.send(chunk)
                progress.add(len(chunk))
            response = connection.getresponse()
            response.read()
        finally:
            connection.close()
    except (OSError, http.client.HTTPException) as error:
        raise _upload_failed(error) from error
    if not 200 <= response.status < 300:
        raise _upload_failed(f"HTTP {response.status}")


def _upload_failed(reason: object) -> ExpectedError:
    return ExpectedError(
        ProviderError.unavailable(f"uploading a disk through the NFC lease: {reason}")
    )


class LeaseProgress:
    """Percent of the bytes sent, told to the lease every few seconds: an idle lease expires."""

    def __init__(self, lease: Any, total: int) -> None:
        self._lease = lease
        self._total = total
        self._sent = 0
        self._told = time.monotonic()

    def add(self, count: int) -> None:
        self._sent += count
        if time.monotonic() - self._told >= PROGRESS_EVERY_SECONDS:
            self.report()

    def report(self, *, done: bool = False) -> None:
        percent = 100 if done else min(99, self._sent * 100 // self._total)
        self._lease.HttpNfcLeaseProgress(percent)
        self._told = time.monotonic()


def abort_lease(instance: Any, lease: Any) -> None:
    """Abort the lease and destroy the VM it made, if vCenter has not already; the caller's
    failure is the one reported."""
    entity = None
    with contextlib.suppress(ExpectedError, *EXPECTED_FAILURES):
        entity = lease.info.entity if lease.info is not None else None
    with contextlib.suppress(ExpectedError, *EXPECTED_FAILURES):
        lease.HttpNfcLeaseAbort()
    if entity is not None:
        with contextlib.suppress(ExpectedError, *EXPECTED_FAILURES):
            wait(instance, entity.Destroy_Task())
