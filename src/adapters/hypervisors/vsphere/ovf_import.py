"""An OVF package made a VM through vCenter's NFC import lease, as vCenter's own clients do:
OvfManager.CreateImportSpec (thin disks), ResourcePool.ImportVApp, then each disk's bytes sent
to the lease's upload URL with progress reported to the lease, which keeps it alive.

A failure (a Failure returned or a fault raised) aborts the lease (vCenter then removes the VM
it was making) and destroys the VM if it is still there: an import leaves a whole VM or
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import IO, Any, Protocol

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.vsphere.nfc_lease import (
    LeaseProgress,
    abort_lease,
    ready_lease_info,
    send_to_lease,
)
from pyrigaud.adapters.hypervisors.vsphere.placement import Location
from pyrigaud.adapters.hypervisors.vsphere.session import Connection
from pyrigaud.domain.errors import ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim


class PackageFiles(Protocol):
    """The files an OVF descriptor references, by href: a fetched package, or one disk."""

    def size(self, href: str) -> Result[int, ProviderError]: ...

    def open(self, href: str) -> Result[AbstractContextManager[IO[bytes]], ProviderError]: ...


def import_spec(
    instance: Any,
    descriptor: str,
    name: str,
    location: Location,
    refused: Callable[[str], ProviderError],
) -> Result[Any, ProviderError]:
    """vCenter's import spec for the descriptor, thin disks (its fileItem list names the files
    to send); a descriptor vCenter cannot use is `refused(its problems)`."""
    params = vim.OvfManager.CreateImportSpecParams(entityName=name, diskProvisioning="thin")
    result = instance.content.ovfManager.CreateImportSpec(
        ovfDescriptor=descriptor,
        resourcePool=location.pool,
        datastore=location.datastore,
        cisp=params,
    )
    if result.error:
        problems = "; ".join(
            getattr(fault, "msg", "") or type(fault).__name__ for fault in result.error
        )
        return Failure(refused(problems))
    return Success(result)


def import_vm(
    connection: Connection,
    package: PackageFiles,
    spec: Any,
    location: Location,
    marks: Mapping[str, str],
) -> Result[Any, ProviderError]:
    """The VM made from the package (powered off), its disks uploaded through the lease. It
    carries `marks` (extraConfig) from its first moment: the building mark lets the leftover
    sweep remove what a provider killed mid-import left."""
    config = spec.importSpec.configSpec
    config.extraConfig = [
        *(config.extraConfig or ()),
        *(vim.option.OptionValue(key=key, value=value) for key, value in marks.items()),
    ]
    lease = location.pool.ImportVApp(
        spec=spec.importSpec, folder=location.folder, host=location.host
    )

    return undone_on_failure(
        partial(_filled, connection, lease, package, spec.fileItem or ()),
        partial(abort_lease, connection, lease),
    )


def _filled(
    connection: Connection, lease: Any, package: PackageFiles, items: Sequence[Any]
) -> Result[Any, ProviderError]:
    """The lease's VM once it is ready, each file item's bytes went to the device URL of the
    same import key (in one stream each) and the lease completed."""
    info: Any
    match ready_lease_info(connection, lease, ProviderError.failed_precondition):
        case Failure() as failed:
            return failed
        case Success(info):
            pass
    by_key = {str(url.importKey): url for url in info.deviceUrl or ()}
    sizes: dict[str, int] = {}
    for item in items:
        match package.size(item.path):
            case Success(size):
                sizes[item.path] = size
            case Failure() as failed:
                return failed
    progress = LeaseProgress(lease, sum(sizes.values()) or 1)
    for item in items:
        device = by_key.get(str(item.deviceId))
        if device is None:
            return Failure(
                ProviderError.failed_precondition(
                    f"the import lease has no upload URL for {item.path!r}"
                )
            )
        opened: AbstractContextManager[IO[bytes]]
        match package.open(item.path):
            case Failure() as failed:
                return failed
            case Success(opened):
                pass
        with opened as reader:
            sent = send_to_lease(
                connection._stub,
                device.url,
                create=bool(item.create),
                size=sizes[item.path],
                reader=reader,
                progress=progress,
            )
        match sent:
            case Failure() as failed:
                return failed
    progress.report(done=True)
    lease.HttpNfcLeaseComplete()
    return Success(info.entity)
