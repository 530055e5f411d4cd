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
from typing import Any

import libvirt
from returns.result import Failure, Result

from pyrigaud.adapters.downloads import (
    ChecksumMismatchError,
    Download,
    DownloadError,
    UnknownChecksumTypeError,
    checksum_algorithm,
    logged_progress,
    open_download,
)
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
from pyrigaud.application.ports.image_judge import ImageJudge
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import DEFAULT_ROOT_DISK_GIB
from pyrigaud.domain.disk_images import JUDGED_PREFIX_BYTES, JudgedImage, peek_header
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.image_urls import UnsafeImageURLError, parse_image_url
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
class ImageDownloads:
    """Downloads of image URLs into new volumes, as the host's settings allow, each image
    judged by `judge` as it streams."""

    allow_loopback_urls: bool
    write_volume: VolumeWriter
    judge: ImageJudge

    def open(self, url: str, checksum: str, checksum_type: str, named: ImageFields) -> Download:
        """The image's response, its headers read; a bad spec is named by `named`."""
        with image_spec_errors(named):
            return open_download(
                url,
                checksum=checksum,
                checksum_type=checksum_type,
                allow_loopback=self.allow_loopback_urls,
            )

    def judged(
        self, chunks: Iterator[bytes], size: int | None, given: str, named: ImageFields
    ) -> tuple[str, Iterator[bytes]]:
        """The image's format, judged from its first MiB before a byte is stored (one the spec
        names in `given` must agree), and all its bytes, the whole image judged after the
        last: a refusal then fails the volume's write, so no volume is left."""
        inspection = self.judge.inspect(size, named.url)

        def inspected() -> Iterator[bytes]:
            for chunk in chunks:
                inspection.feed(chunk)
                yield chunk

        _, body = peek_header(inspected(), JUDGED_PREFIX_BYTES)
        found = _judged_or_refused(inspection.first_look()).format
        if found not in IMAGE_FORMATS:
            raise ExpectedError(
                ProviderError.invalid_spec(
                    named.url, f"the image is {found}; libvirt images are qcow2 or raw"
                )
            )
        declared = declared_format(given, named.format)
        if declared and declared != found:
            raise ExpectedError(
                ProviderError.invalid_spec(named.format, f"the image is {found}, not {declared}")
            )

        def whole() -> Iterator[bytes]:
            yield from body
            _judged_or_refused(inspection.verdict())

        return found, whole()

    def write(
        self,
        conn: VirConnect,
        pool: Any,
        xml: str,
        download: Download,
        *,
        named: ImageFields,
        label: str,
        body: Iterator[bytes] | None = None,
    ) -> str:
        """A new volume holding the downloaded image (`body`, if some was already read, else
        the download's chunks), its checksum verified; on any failure, no volume."""
        chunks = logged_progress(body or download.chunks, label, download.length)
        with image_spec_errors(named):
            return upload_or_refuse(
                lambda: write_new_volume(conn, pool, xml, chunks, self.write_volume)
            )

    def root_volume(
        self, conn: VirConnect, pool: Any, name: str, image: VMImage, root: RootPlan
    ) -> str:
        """The VM's own qcow2 root volume `name` from a URL image: never a file another VM
        shares, never a backing chain. A qcow2 image is downloaded straight into it, a raw one
        into the scratch volume and converted (libvirt converts only from volume to volume);
        then it is grown to the class's size. On any failure, neither volume is left."""
        download = self.open(image.url, image.checksum, image.checksum_type, CREATE_FIELDS)
        with contextlib.closing(download):
            with image_spec_errors(CREATE_FIELDS):
                image_format, body = self.judged(
                    download.chunks, download.length, image.format, CREATE_FIELDS
                )
            # Declared raw at its exact length: libvirt reads what the bytes are on refresh.
            target = name if image_format == "qcow2" else root.scratch_name
            xml = volume_xml(target, download.length or 0, volume_format="raw")
            label = f"root volume {name!r}"
            written = self.write(
                conn, pool, xml, download, named=CREATE_FIELDS, label=label, body=body
            )
        path = written if image_format == "qcow2" else ""
        try:
            _check_stored_format(conn, written, image_format)
            path = path or copy_volume(conn, written, name)
            current = volume_facts(conn, path)
            if current is not None and current.capacity_bytes < root.capacity_bytes:
                grow_volume(conn, path, root.capacity_bytes)
        except BaseException:
            if path:
                delete_volume(conn, path)
            raise
        finally:
            if written != path:
                delete_volume(conn, written)
        return path


@contextlib.contextmanager
def image_spec_errors(named: ImageFields) -> Iterator[None]:
    """What the download module raises, as the error naming the request field at fault."""
    try:
        yield
    except UnsafeImageURLError as error:
        raise ExpectedError(ProviderError.invalid_spec(named.url, str(error))) from error
    except UnknownChecksumTypeError as error:
        raise ExpectedError(ProviderError.invalid_spec(named.checksum_type, str(error))) from error
    except ChecksumMismatchError as error:
        raise ExpectedError(ProviderError.invalid_spec(named.checksum, str(error))) from error
    except DownloadError as error:
        raise ExpectedError(ProviderError.unavailable(str(error))) from error


def plan_root_disk(conn: VirConnect, request: CreateRequest) -> RootPlan:
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
        return RootPlan(capacity_bytes=wanted or DEFAULT_ROOT_DISK_GIB * GIB)
    if image.template_name:
        raise ExpectedError(
            ProviderError.invalid_spec(
                fields.IMAGE_TEMPLATE_NAME, "libvirt has no templates; give a Path or URL"
            )
        )
    if not image.path:
        declared_format(image.format, CREATE_FIELDS.format)
        with image_spec_errors(CREATE_FIELDS):
            parse_image_url(image.url)
            checksum_algorithm(image.checksum_type)
        scratch = f"{request.name}-download-{secrets.token_hex(4)}.raw"
        return RootPlan(capacity_bytes=wanted, url_image=image, scratch_name=scratch)
    backing = volume_facts(conn, image.path)
    if backing is None:
        raise ExpectedError(
            ProviderError.invalid_spec(
                fields.IMAGE_PATH, f"{image.path!r} is not a volume in any storage pool"
            )
        )
    return RootPlan(capacity_bytes=max(wanted, backing.capacity_bytes), backing=backing)


def declared_format(given: str, field: str) -> str:
    """The image format a spec names ("" for none); any other than qcow2 or raw is refused."""
    chosen = given.strip().lower()
    if chosen in UNSPECIFIED_FORMATS:
        return ""
    if chosen not in IMAGE_FORMATS:
        raise ExpectedError(ProviderError.invalid_spec(field, f"{given!r} is not qcow2 or raw"))
    return chosen


def _check_stored_format(conn: VirConnect, path: str, expected: str) -> None:
    """libvirt must read the stored image as the format its header showed: an image taken for
    raw that libvirt reads as, say, vmdk would be converted by following that format's own
    references to other files."""
    stored = volume_facts(conn, path)
    found = stored.format if stored is not None else "missing"
    if found != expected:
        raise ExpectedError(
            ProviderError.invalid_spec(
                CREATE_FIELDS.url, f"libvirt reads the image as {found}; give a qcow2 or raw image"
            )
        )


def upload_or_refuse(upload: Callable[[], str]) -> str:
    """`upload`'s volume path; a driver that cannot upload volumes is an unsupported call."""
    try:
        return upload()
    except libvirt.libvirtError as error:
        if error_code(error) != libvirt.VIR_ERR_NO_SUPPORT:
            raise
        raise ExpectedError(
            ProviderError.unsupported(
                "this libvirt driver cannot upload volumes (virStorageVolUpload): import "
                "the image from a volume already in a storage pool"
            )
        ) from error


def _judged_or_refused(judged: Result[JudgedImage, ProviderError]) -> JudgedImage:
    """The judged image; a refused one as the error naming the field it came from."""
    if isinstance(judged, Failure):
        raise ExpectedError(judged.failure())
    return judged.unwrap()
