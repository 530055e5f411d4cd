"""An OVF package made a VM through vCenter's NFC import lease, as vCenter's own clients do:
OvfManager.CreateImportSpec (thin disks), ResourcePool.ImportVApp, then each disk's bytes sent
to the lease's upload URL with progress reported to the lease, which keeps it alive.

A failure aborts the lease (vCenter then removes the VM it was making) and destroys the VM if
it is still there: an import leaves a whole VM or nothing.
"""

from __future__ import annotations

import contextlib
import http.client
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.errors import EXPECTED_FAILURES, fault_message
from pyrigaud.adapters.hypervisors.vsphere.ovf_package import Package
from pyrigaud.adapters.hypervisors.vsphere.placement import Location
from pyrigaud.adapters.hypervisors.vsphere.tasks import wait
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

CHUNK_BYTES = 1024 * 1024
LEASE_POLL_SECONDS = 0.2
LEASE_READY_SECONDS = 300.0
PROGRESS_EVERY_SECONDS = 5.0


def import_spec(instance: Any, package: Package, name: str, location: Location) -> Any:
    """vCenter's import spec for the package (its fileItem list names the files to send);
    a descriptor vCenter cannot use is INVALID_SPEC naming the URL."""
    params = vim.OvfManager.CreateImportSpecParams(entityName=name, diskProvisioning="thin")
    result = instance.content.ovfManager.CreateImportSpec(
        ovfDescriptor=package.descriptor,
        resourcePool=location.pool,
        datastore=location.datastore,
        cisp=params,
    )
    if result.error:
        problems = "; ".join(
            getattr(fault, "msg", "") or type(fault).__name__ for fault in result.error
        )
        raise ExpectedError(
            ProviderError.invalid_spec(
                fields.PREPARE_OVA_URL, f"vCenter refuses the OVF: {problems}"
            )
        )
    return result


def import_vm(instance: Any, package: Package, spec: Any, location: Location) -> Any:
    """The VM made from the package (powered off), its disks uploaded through the lease."""
    lease = location.pool.ImportVApp(
        spec=spec.importSpec, folder=location.folder, host=location.host
    )
    try:
        info = _ready(lease)
        _upload(instance, lease, info.deviceUrl or (), package, spec.fileItem or ())
        lease.HttpNfcLeaseComplete()
    except BaseException:
        _discard(instance, lease)
        raise
    return info.entity


def _ready(lease: Any) -> Any:
    deadline = time.monotonic() + LEASE_READY_SECONDS
    while True:
        state = lease.state
        if state == vim.HttpNfcLease.State.ready:
            return lease.info
        if state == vim.HttpNfcLease.State.error:
            raise ExpectedError(ProviderError.internal(fault_message(lease.error)))
        if time.monotonic() > deadline:
            raise ExpectedError(ProviderError.unavailable("the import lease never became ready"))
        time.sleep(LEASE_POLL_SECONDS)


def _upload(
    instance: Any, lease: Any, urls: Sequence[Any], package: Package, items: Sequence[Any]
) -> None:
    """Each file item's bytes to the device URL of the same import key, in one stream each."""
    by_key = {str(url.importKey): url for url in urls}
    total = sum(package.size(item.path) for item in items) or 1
    progress = _Progress(lease, total)
    for item in items:
        device = by_key.get(str(item.deviceId))
        if device is None:
            raise ExpectedError(
                ProviderError.internal(f"the import lease has no upload URL for {item.path!r}")
            )
        with package.open(item.path) as reader:
            _send(
                instance._stub,
                device.url,
                create=bool(item.create),
                size=package.size(item.path),
                reader=reader,
                progress=progress,
            )
    progress.report(done=True)


def _send(
    stub: Any, url: str, *, create: bool, size: int, reader: Any, progress: _Progress
) -> None:
    """PUT (a new file) or POST the bytes to the lease URL, over the session's TLS settings.
    vCenter answers its URLs with `*` as the host: the endpoint the session talks to."""
    parts = urlsplit(url)
    host = stub.host if parts.hostname == "*" else parts.netloc
    connection = stub.scheme(host, **stub.schemeArgs)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        connection.putrequest("PUT" if create else "POST", target)
        connection.putheader("Content-Type", "application/x-vnd.vmware-streamVmdk")
        connection.putheader("Content-Length", str(size))
        if stub.cookie:
            connection.putheader("Cookie", stub.cookie)
        connection.endheaders()
        while chunk := reader.read(CHUNK_BYTES):
            connection.send(chunk)
            progress.add(len(chunk))
        response = connection.getresponse()
        response.read()
    except (OSError, http.client.HTTPException) as error:
        raise ExpectedError(
            ProviderError.unavailable(f"uploading a disk of the import: {error}")
        ) from error
    finally:
        connection.close()
    if not 200 <= response.status < 300:
        raise ExpectedError(
            ProviderError.unavailable(f"uploading a disk of the import: HTTP {response.status}")
        )


class _Progress:
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


def _discard(instance: Any, lease: Any) -> None:
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
