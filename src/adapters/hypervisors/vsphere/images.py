"""ImagePrepare on vSphere: an OVA or OVF from a URL imported as a template named after the
image, once per name; or a template that already exists, verified.

Order, as upstream's provider: a VM or template already named `target_name` is the prepared
image (nothing is fetched); then `templateName` is only verified; a content library is not
implemented; an `ovaURL` is downloaded (checksum verified before anything is imported),
imported with thin disks and marked as a template.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import IO, Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.qemu_img import checked_vmdk
from pyrigaud.adapters.disk_images.scratch import scratch_file
from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.vsphere.calls import best_effort, run
from pyrigaud.adapters.hypervisors.vsphere.ovf_import import import_spec, import_vm
from pyrigaud.adapters.hypervisors.vsphere.ovf_package import (
    Package,
    fetch_referenced,
    fetched_package,
    read_tar,
)
from pyrigaud.adapters.hypervisors.vsphere.placement import Location, import_location
from pyrigaud.adapters.hypervisors.vsphere.tasks import wait
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import BUILDING_KEY, ImportMarks
from pyrigaud.application.ports.image_judge import ImageInspection, ImageJudge
from pyrigaud.domain import fields
from pyrigaud.domain.disk_images import JudgedImage
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import ImageSource, Placement, PreparedImage, PrepareImageRequest

# An OVF file item's CIM resource type for a disk drive (DMTF CIM_ResourceAllocationSettingData).
CIM_DISK_DRIVE = 17
JUDGED_CHUNK_BYTES = 1024 * 1024
# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim


class VSphereImages:
    def __init__(
        self,
        vcenter: VCenter,
        defaults: Placement,
        marks: ImportMarks,
        judge: ImageJudge,
        *,
        allow_loopback_urls: bool,
        scratch_dir: str | None = None,
    ) -> None:
        """`defaults` are the PROVIDER_DEFAULT_* placement settings; `marks` what an imported
        VM carries until it is complete; `judge` judges each disk of a package before vCenter
        sees it, in a scratch copy under `scratch_dir` (None: the system's temporary directory);
        `allow_loopback_urls` is PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK (tests only)."""
        self._vcenter = vcenter
        self._defaults = defaults
        self._marks = marks
        self._judge = judge
        self._scratch_dir = scratch_dir
        self._allow_loopback_urls = allow_loopback_urls

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        return run(
            self._vcenter.session,
            f"preparing image {request.target_name!r}",
            lambda instance: self._prepare(instance, request),
        )

    def _prepare(
        self, instance: Any, request: PrepareImageRequest
    ) -> Result[PreparedImage, ProviderError]:
        source = request.source
        existing = self._vcenter.record(instance, request.target_name)
        if existing is not None:
            return self._marks.refuse_unfinished(existing, "an import of the image").map(
                lambda _: PreparedImage(id=request.target_name)
            )
        if source.template_name:
            if self._vcenter.vm_named(instance, source.template_name) is None:
                return Failure(
                    ProviderError.not_found(f"no template named {source.template_name!r}")
                )
            return Success(PreparedImage(id=source.template_name))
        if source.content_library is not None:
            return Failure(
                ProviderError.unsupported(
                    "importing from a content library is not "
                    "implemented for vSphere; give an ovaURL or a templateName",
                    fields.PREPARE_CONTENT_LIBRARY,
                )
            )
        if not source.url:
            return Failure(
                ProviderError.invalid_spec(
                    fields.PREPARE_OVA_URL, "vSphere imports an OVA or OVF from a URL, not a path"
                )
            )
        return (
            import_location(instance, self._defaults, request.storage_hint)
            .bind(lambda location: self._import(instance, source, request, location))
            .bind(lambda vm: self._made_template(instance, vm))
            .map(lambda _: PreparedImage(id=request.target_name))
        )

    def _import(
        self,
        instance: Any,
        source: ImageSource,
        request: PrepareImageRequest,
        location: Location,
    ) -> Result[Any, ProviderError]:
        """The VM the package makes, its disks judged before vCenter sees them; the package's
        files are gone once it is made."""
        loopback = self._allow_loopback_urls

        def judged(package: Package, spec: Any) -> Result[None, ProviderError]:
            for item in spec.fileItem or ():
                if item.cimType == CIM_DISK_DRIVE:
                    match _judged_disk(self._judge, package, str(item.path), self._scratch_dir):
                        case Failure() as failed:
                            return failed
            return Success(None)

        def made(package: Package) -> Result[Any, ProviderError]:
            return import_spec(
                instance, package.descriptor, request.target_name, location, _refused_package
            ).bind(
                lambda spec: (
                    fetch_referenced(
                        package,
                        source.url,
                        [str(item.path) for item in spec.fileItem or ()],
                        allow_loopback=loopback,
                    )
                    .bind(lambda _: judged(package, spec))
                    .bind(
                        # A tar damaged where a file lies fails while the lease reads it.
                        lambda _: read_tar(
                            lambda: import_vm(
                                instance, package, spec, location, self._marks.building()
                            )
                        )
                    )
                )
            )

        with contextlib.ExitStack() as holds:
            return fetched_package(
                source.url,
                checksum=source.checksum,
                checksum_type=source.checksum_type,
                allow_loopback=loopback,
                holds=holds,
            ).bind(made)

    def _made_template(self, instance: Any, vm: Any) -> Result[None, ProviderError]:
        """The imported VM unmarked and made a template, or destroyed again: the caller's
        failure is the one told (so the cleanup's own is not)."""
        return undone_on_failure(
            lambda: self._vcenter.set_extra_config(instance, vm, {BUILDING_KEY: ""}).map(
                lambda _: vm.MarkAsTemplate()
            ),
            lambda: _destroy(instance, vm),
        )


def _destroy(instance: Any, vm: Any) -> None:
    """The caller's failure is the one told (so this cleanup's own is not)."""
    best_effort(lambda: wait(instance, vm.Destroy_Task()))


def _judged_disk(
    judge: ImageJudge, package: Package, href: str, scratch_dir: str | None
) -> Result[None, ProviderError]:
    """A disk of the package judged whole before vCenter sees it: vCenter takes only a vmdk,
    and one naming other extent files is refused by the judge, one cut short or garbled by
    qemu reading it whole (from a scratch copy: an OVA's disk lies inside its tar)."""

    def copied(size: int) -> Result[None, ProviderError]:
        inspection = judge.inspect(size, fields.PREPARE_OVA_URL)
        with scratch_file(scratch_dir) as copy:

            def fed(opened: AbstractContextManager[IO[bytes]]) -> Result[None, ProviderError]:
                with opened as reader:
                    while chunk := reader.read(JUDGED_CHUNK_BYTES):
                        inspection.feed(chunk)
                        copy.write(chunk)
                return Success(None)

            return read_tar(lambda: package.open(href).bind(fed)).bind(
                lambda _: _verdict(inspection, copy, href)
            )

    return package.size(href).bind(copied)


def _verdict(
    inspection: ImageInspection, copy: IO[bytes], href: str
) -> Result[None, ProviderError]:
    """The judge's verdict on the whole disk, then qemu's reading of the copy; a refusal
    names the package's disk. ImagePrepare is no transfer its caller stops: qemu is bounded by
    its limits alone."""
    checked = (
        inspection.first_look()
        .bind(lambda _: inspection.verdict())
        .bind(_a_vmdk)
        .bind(
            lambda image: checked_vmdk(
                copy, image.virtual_size_bytes, fields.PREPARE_OVA_URL, watch=None
            )
        )
    )
    return checked.alt(
        lambda error: error.model_copy(
            update={"message": f"{error.message} (the package's disk {href!r})"}
        )
    )


def _a_vmdk(image: JudgedImage) -> Result[JudgedImage, ProviderError]:
    if image.format != "vmdk":
        return Failure(
            ProviderError.invalid_spec(
                fields.PREPARE_OVA_URL, f"the image is {image.format}, not a vmdk"
            )
        )
    return Success(image)


def _refused_package(problems: str) -> ProviderError:
    """A descriptor vCenter cannot use is the image's fault: its URL is the field named."""
    return ProviderError.invalid_spec(
        fields.PREPARE_OVA_URL, f"vCenter refuses the OVF: {problems}"
    )
