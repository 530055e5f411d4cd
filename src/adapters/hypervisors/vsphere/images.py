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
from functools import partial
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
from pyrigaud.adapters.hypervisors.vsphere.tasks import destroyed
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
            partial(self._prepare, request=request),
        )

    def _prepare(
        self, instance: Any, request: PrepareImageRequest
    ) -> Result[PreparedImage, ProviderError]:
        source = request.source

        def prepared(_made: None) -> PreparedImage:
            return PreparedImage(id=request.target_name)

        existing = self._vcenter.record(instance, request.target_name)
        if existing is not None:
            return self._marks.refuse_unfinished(existing, "an import of the image").map(prepared)
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
            .bind(partial(self._import, instance, source, request))
            .bind(partial(self._made_template, instance))
            .map(prepared)
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

        def judged(package: Package, spec: Any, _fetched: None) -> Result[None, ProviderError]:
            for item in spec.fileItem or ():
                if item.cimType == CIM_DISK_DRIVE:
                    match _judged_disk(self._judge, package, str(item.path), self._scratch_dir):
                        case Failure() as failed:
                            return failed
            return Success(None)

        def vm_made(package: Package, spec: Any, _judged: None) -> Result[Any, ProviderError]:
            # A tar damaged where a file lies fails while the lease reads it.
            marks = self._marks.building()
            return read_tar(partial(import_vm, instance, package, spec, location, marks))

        def imported(package: Package, spec: Any) -> Result[Any, ProviderError]:
            hrefs = [str(item.path) for item in spec.fileItem or ()]
            return (
                fetch_referenced(package, source.url, hrefs, allow_loopback=loopback)
                .bind(partial(judged, package, spec))
                .bind(partial(vm_made, package, spec))
            )

        def made(package: Package) -> Result[Any, ProviderError]:
            return import_spec(
                instance, package.descriptor, request.target_name, location, _refused_package
            ).bind(partial(imported, package))

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

        def template(_unmarked: None) -> None:
            vm.MarkAsTemplate()

        def unmarked_template() -> Result[None, ProviderError]:
            return self._vcenter.set_extra_config(instance, vm, {BUILDING_KEY: ""}).map(template)

        return undone_on_failure(unmarked_template, partial(_destroy, instance, vm))


def _destroy(instance: Any, vm: Any) -> None:
    """The caller's failure is the one told (so this cleanup's own is not)."""
    best_effort(partial(destroyed, instance, vm))


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

            def opened_and_fed() -> Result[None, ProviderError]:
                return package.open(href).bind(fed)

            def judged(_fed: None) -> Result[None, ProviderError]:
                return _verdict(inspection, copy, href)

            return read_tar(opened_and_fed).bind(judged)

    return package.size(href).bind(copied)


def _verdict(
    inspection: ImageInspection, copy: IO[bytes], href: str
) -> Result[None, ProviderError]:
    """The judge's verdict on the whole disk, then qemu's reading of the copy; a refusal
    names the package's disk. ImagePrepare is no transfer its caller stops: qemu is bounded by
    its limits alone."""

    def whole_verdict(_first_look: JudgedImage) -> Result[JudgedImage, ProviderError]:
        return inspection.verdict()

    def read_by_qemu(image: JudgedImage) -> Result[None, ProviderError]:
        return checked_vmdk(copy, image.virtual_size_bytes, fields.PREPARE_OVA_URL, watch=None)

    def naming_the_disk(error: ProviderError) -> ProviderError:
        return error.model_copy(
            update={"message": f"{error.message} (the package's disk {href!r})"}
        )

    checked = inspection.first_look().bind(whole_verdict).bind(_a_vmdk).bind(read_by_qemu)
    return checked.alt(naming_the_disk)


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
