"""Where a VM's root disk and a prepared image get their bytes: a pool volume or a URL.

Shared by Create (provisioning) and ImagePrepare (images). A spec that cannot work is refused
before anything exists and before any traffic, naming the request field at fault as the
manager sent it: ImagePrepare sends the CRD's camelCase keys, Create the VMImage's PascalCase
ones.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.downloads import (
    Download,
    DownloadFields,
    checksum_algorithm,
    logged_progress,
    open_download,
)
from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure, undone_on_raise
from pyrigaud.adapters.hypervisors.libvirt.calls import caught
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    GIB,
    VolumeFacts,
    VolumeWriter,
    copy_volume,
    delete_volume,
    grow_volume,
    volume_facts,
    volume_xml,
    write_new_volume,
)
from pyrigaud.application.ports.image_judge import ImageInspection, ImageJudge
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import DEFAULT_ROOT_DISK_GIB
from pyrigaud.domain.chunks import Chunks
from pyrigaud.domain.disk_images import JUDGED_PREFIX_BYTES, peek_header
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.image_urls import parse_image_url
from pyrigaud.domain.models import CreateRequest, VMImage

IMAGE_FORMATS = frozenset({"qcow2", "raw"})
UNSPECIFIED_FORMATS = frozenset({"", "template"})


@dataclass(frozen=True)
class ImageFields:
    """The request fields an image's problems are named by."""

    url: str
    checksum: str
    checksum_type: str
    format: str

    @property
    def download(self) -> DownloadFields:
        return DownloadFields(self.url, self.checksum, self.checksum_type)


PREPARE_FIELDS = ImageFields(
    fields.PREPARE_URL,
    fields.PREPARE_CHECKSUM,
    fields.PREPARE_CHECKSUM_TYPE,
    fields.PREPARE_FORMAT,
)
CREATE_FIELDS = ImageFields(
    fields.IMAGE_URL, fields.IMAGE_CHECKSUM, fields.IMAGE_CHECKSUM_TYPE, fields.IMAGE_FORMAT
)


@dataclass(frozen=True)
class RootPlan:
    """How Create makes the root volume: its capacity and where its content comes from."""

    capacity_bytes: int  # a URL image larger than this keeps its own size
    backing: VolumeFacts | None = None  # a Path image: the volume the qcow2 overlay sits on
    url_image: VMImage | None = None  # a URL image, downloaded into the VM's own volume
    scratch_name: str = ""  # where a raw URL image lands before its conversion to qcow2


@dataclass(frozen=True)
class JudgedBody:
    """An image whose format was judged from its first MiB: all its bytes, still to read, and
    the judge's verdict on the whole, once they were read."""

    format: str
    chunks: Chunks[bytes]
    inspection: ImageInspection

    def stored(
        self, conn: VirConnect, upload: Callable[[Iterator[bytes]], str]
    ) -> Result[str, ProviderError]:
        """The volume `upload` writes all the bytes into (its path), or, when they were not all
        of the image (a cut download, a checksum that does not match) or the whole image is
        refused, that Failure, and no volume."""

        def uploaded(chunks: Iterator[bytes]) -> Result[str, ProviderError]:
            return upload_or_refuse(partial(upload, chunks))

        def deleted(written: Result[str, ProviderError]) -> None:
            match written:
                case Success(path):
                    delete_volume(conn, path)

        def judged(path: str) -> Result[str, ProviderError]:
            def whole() -> Result[str, ProviderError]:
                return Result.do(path for _ in self.inspection.verdict())

            return undone_on_failure(whole, partial(delete_volume, conn, path))

        return self.chunks.answered_by(uploaded, cut_short=deleted).bind(judged)


@dataclass(frozen=True)
class ImageDownloads:
    """Downloads of image URLs into new volumes, as the host's settings allow, each image
    judged by `judge` as it streams."""

    allow_loopback_urls: bool
    write_volume: VolumeWriter
    judge: ImageJudge

    def open(
        self, url: str, checksum: str, checksum_type: str, named: ImageFields
    ) -> Result[Download, ProviderError]:
        """The image's response, its headers read; a bad spec is named by `named`."""
        return open_download(
            url,
            checksum=checksum,
            checksum_type=checksum_type,
            allow_loopback=self.allow_loopback_urls,
            named=named.download,
        )

    def judged(
        self, chunks: Iterator[bytes], size: int | None, given: str, named: ImageFields
    ) -> Result[JudgedBody, ProviderError]:
        """The image's format, judged from its first MiB before a byte is stored (one the spec
        names in `given` must agree), and all its bytes, the whole image judged after the
        last (`JudgedBody.stored`). A source cut short within the first MiB is
        answered as its failure, before the judge's."""
        inspection = self.judge.inspect(size, named.url)

        def inspected() -> Iterator[Result[bytes, ProviderError]]:
            for chunk in chunks:
                inspection.feed(chunk)
                yield Success(chunk)

        peeked = Chunks(inspected(), after=chunks).consumed_by(
            partial(peek_header, count=JUDGED_PREFIX_BYTES)
        )
        return Result.do(
            JudgedBody(found, body, inspection)
            for _, body in peeked
            for image in inspection.first_look()
            for found in _agreed_format(image.format, given, named)
        )

    def write(
        self,
        conn: VirConnect,
        pool: Any,
        xml: str,
        download: Download,
        *,
        named: ImageFields,
        label: str,
        body: JudgedBody,
    ) -> Result[str, ProviderError]:
        """A new volume holding the downloaded image (`body`, judged from the download), its
        checksum verified and the whole image judged; on any failure, no volume."""

        def uploaded(chunks: Iterator[bytes]) -> str:
            logged = logged_progress(chunks, label, download.length)
            return write_new_volume(conn, pool, xml, logged, self.write_volume)

        return body.stored(conn, uploaded)

    def root_volume(
        self, conn: VirConnect, pool: Any, name: str, image: VMImage, root: RootPlan
    ) -> Result[str, ProviderError]:
        """The VM's own qcow2 root volume `name` from a URL image: never a file another VM
        shares, never a backing chain. A qcow2 image is downloaded straight into it, a raw one
        into the scratch volume and converted (libvirt converts only from volume to volume);
        then it is grown to the class's size. On any failure, neither volume is left."""

        def downloaded(download: Download) -> Result[tuple[str, str], ProviderError]:
            def written(body: JudgedBody) -> Result[tuple[str, str], ProviderError]:
                # Declared raw at its exact length: libvirt reads what the bytes are on refresh.
                target = name if body.format == "qcow2" else root.scratch_name
                xml = volume_xml(target, download.length or 0, volume_format="raw")
                label = f"root volume {name!r}"

                def with_format(path: str) -> tuple[str, str]:
                    return path, body.format

                return self.write(
                    conn, pool, xml, download, named=CREATE_FIELDS, label=label, body=body
                ).map(with_format)

            with contextlib.closing(download):
                return self.judged(
                    download.chunks, download.length, image.format, CREATE_FIELDS
                ).bind(written)

        def finished(stored: tuple[str, str]) -> Result[str, ProviderError]:
            written, image_format = stored
            return _finished_root(conn, written, image_format, name, root)

        return (
            self.open(image.url, image.checksum, image.checksum_type, CREATE_FIELDS)
            .bind(downloaded)
            .bind(finished)
        )


def _finished_root(
    conn: VirConnect, written: str, image_format: str, name: str, root: RootPlan
) -> Result[str, ProviderError]:
    """The root volume from the `written` image: checked as libvirt reads it, a raw one
    converted into `name` (the scratch volume then goes), grown to the class's size."""
    if image_format == "qcow2":

        def checked_and_grown() -> Result[str, ProviderError]:
            return Result.do(
                _grown(conn, written, root.capacity_bytes)
                for _ in _check_stored_format(conn, written, image_format)
            )

        return undone_on_failure(checked_and_grown, partial(delete_volume, conn, written))
    try:
        converted = Result.do(
            copy_volume(conn, written, name)
            for _ in _check_stored_format(conn, written, image_format)
        )
    finally:
        delete_volume(conn, written)

    def grown_or_deleted(path: str) -> str:
        return undone_on_raise(
            partial(_grown, conn, path, root.capacity_bytes), partial(delete_volume, conn, path)
        )

    return converted.map(grown_or_deleted)


def _grown(conn: VirConnect, path: str, capacity_bytes: int) -> str:
    """The volume at `path`, grown to `capacity_bytes` if it is smaller."""
    current = volume_facts(conn, path)
    if current is not None and current.capacity_bytes < capacity_bytes:
        grow_volume(conn, path, capacity_bytes)
    return path


def plan_root_disk(conn: VirConnect, request: CreateRequest) -> Result[RootPlan, ProviderError]:
    """How the root volume is made; a spec it cannot be made from is refused before anything
    exists and before any traffic.

    A Path image (a prepared one) gets a qcow2 overlay: copy-on-write, so VMs from one image
    never share a writable file, and no copy. A URL image (when no Path is given) is
    downloaded into the VM's own volume, planned with a scratch name for a raw image's
    conversion, so a crash mid-download leaves only volumes the building VM records.
    """
    image = request.image
    wanted = request.vm_class.disk_defaults.size_gib * GIB
    if image.is_blank:
        return Success(RootPlan(capacity_bytes=wanted or DEFAULT_ROOT_DISK_GIB * GIB))
    if image.template_name:
        return Failure(
            ProviderError.invalid_spec(
                fields.IMAGE_TEMPLATE_NAME, "libvirt has no templates; give a Path or URL"
            )
        )
    if not image.path:
        scratch = f"{request.name}-download-{secrets.token_hex(4)}.raw"
        return Result.do(
            RootPlan(capacity_bytes=wanted, url_image=image, scratch_name=scratch)
            for _ in declared_format(image.format, CREATE_FIELDS.format)
            for _ in parse_image_url(image.url, CREATE_FIELDS.url)
            for _ in checksum_algorithm(image.checksum_type, CREATE_FIELDS.checksum_type)
        )
    backing = volume_facts(conn, image.path)
    if backing is None:
        return Failure(
            ProviderError.invalid_spec(
                fields.IMAGE_PATH, f"{image.path!r} is not a volume in any storage pool"
            )
        )
    return Success(RootPlan(capacity_bytes=max(wanted, backing.capacity_bytes), backing=backing))


def declared_format(given: str, field: str) -> Result[str, ProviderError]:
    """The image format a spec names ("" for none); any other than qcow2 or raw is refused."""
    chosen = given.strip().lower()
    if chosen in UNSPECIFIED_FORMATS:
        return Success("")
    if chosen not in IMAGE_FORMATS:
        return Failure(ProviderError.invalid_spec(field, f"{given!r} is not qcow2 or raw"))
    return Success(chosen)


def _agreed_format(found: str, given: str, named: ImageFields) -> Result[str, ProviderError]:
    """The judged format `found`, if libvirt images may be of it and the spec's agrees."""
    if found not in IMAGE_FORMATS:
        return Failure(
            ProviderError.invalid_spec(
                named.url, f"the image is {found}; libvirt images are qcow2 or raw"
            )
        )

    def agreed(declared: str) -> Result[str, ProviderError]:
        if declared and declared != found:
            return Failure(
                ProviderError.invalid_spec(named.format, f"the image is {found}, not {declared}")
            )
        return Success(found)

    return declared_format(given, named.format).bind(agreed)


def _check_stored_format(conn: VirConnect, path: str, expected: str) -> Result[None, ProviderError]:
    """libvirt must read the stored image as the format its header showed: an image taken for
    raw that libvirt reads as, say, vmdk would be converted by following that format's own
    references to other files."""
    stored = volume_facts(conn, path)
    found = stored.format if stored is not None else "missing"
    if found != expected:
        return Failure(
            ProviderError.invalid_spec(
                CREATE_FIELDS.url, f"libvirt reads the image as {found}; give a qcow2 or raw image"
            )
        )
    return Success(None)


def upload_or_refuse(upload: Callable[[], str]) -> Result[str, ProviderError]:
    """`upload`'s volume path; a driver that cannot upload volumes is an unsupported call."""

    def unsupported(error: libvirt.libvirtError) -> ProviderError | None:
        if error_code(error) != libvirt.VIR_ERR_NO_SUPPORT:
            return None
        return ProviderError.unsupported(
            "this libvirt driver cannot upload volumes (virStorageVolUpload): import "
            "the image from a volume already in a storage pool"
        )

    def uploaded() -> Result[str, ProviderError]:
        return Success(upload())

    return caught(uploaded, unsupported)
