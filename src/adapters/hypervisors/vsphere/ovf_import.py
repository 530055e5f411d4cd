"""An OVF package made a VM through vCenter's NFC import lease, as vCenter's own clients do:
OvfManager.CreateImportSpec (thin disks), ResourcePool.ImportVApp, then each disk's bytes sent
to the lease's upload URL with progress reported to the lease, which keeps it alive.

A failure aborts the lease (vCenter then removes the VM it was making) and destroys the VM if
it is still there: an import leaves a whole VM or nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import IO, Any, Protocol

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.nfc_lease import (
    LeaseProgress,
    abort_lease,
    ready_lease_info,
    send_to_lease,
)
from pyrigaud.adapters.hypervisors.vsphere.placement import Location
from pyrigaud.domain.errors import ExpectedError, ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim


class PackageFiles(Protocol):
    """The files an OVF descriptor references, by href: a fetched package, or one disk."""

    def size(self, href: str) -> int: ...

    def open(self, href: str) -> AbstractContextManager[IO[bytes]]: ...


def import_spec(
    instance: Any,
    descriptor: str,
    name: str,
    location: Location,
    refused: Callable[[str], ProviderError],
) -> Any:
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
        raise ExpectedError(refused(problems))
    return result


def import_vm(
    instance: Any,
    package: PackageFiles,
    spec: Any,
    location: Location,
    marks: Mapping[str, str],
) -> Any:
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
    try:
        info = ready_lease_info(lease)
        _upload(instance, lease, info.deviceUrl or (), package, spec.fileItem or ())
        lease.HttpNfcLeaseComplete()
    except BaseException:
        abort_lease(instance, lease)
        raise
    return info.entity


def _upload(
    instance: Any, lease: Any, urls: Sequence[Any], package: PackageFiles, items: Sequence[Any]
) -> None:
    """Each file item's bytes to the device URL of the same import key, in one stream each."""
    by_key = {str(url.importKey): url for url in urls}
    total = sum(package.size(item.path) for item in items) or 1
    progress = LeaseProgress(lease, total)
    for item in items:
        device = by_key.get(str(item.deviceId))
        if device is None:
            raise ExpectedError(
                ProviderError.internal(f"the import lease has no upload URL for {item.path!r}")
            )
        with package.open(item.path) as reader:
            send_to_lease(
                instance._stub,
                device.url,
                create=bool(item.create),
                size=package.size(item.path),
                reader=reader,
                progress=progress,
            )
    progress.report(done=True)
