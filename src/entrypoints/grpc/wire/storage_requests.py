"""ImagePrepare and disk-transfer (ExportDisk, ImportDisk, GetDiskInfo) payloads -> domain.

ImagePrepare sends the CRD's camelCase image source; the transfers name a storage backend
(pvc, nfs, s3), a transfer mode and free-form storage options.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from hashlib import sha256

from returns.result import Failure

from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError
from pyrigaud.domain.models import (
    ContentLibraryItem,
    DiskQuery,
    ExportRequest,
    ImageSource,
    ImportRequest,
    PrepareImageRequest,
    TransferBackend,
    TransferMode,
)
from pyrigaud.domain.staging import StagedLocation, parse_staged_location
from pyrigaud.entrypoints.grpc.wire.document import (
    Document,
    as_text,
    checked_name,
    invalid,
    load,
    parser,
)
from pyrigaud.entrypoints.grpc.wire.vm_requests import vm_image

_DISK_FORMATS = ("qcow2", "raw", "vmdk")


@parser
def parse_prepare_image(
    *, image_json: str, target_name: str, storage_hint: str
) -> PrepareImageRequest:
    """The CRD's `{"source": {"libvirt"|"vsphere"|"http": {...}}}`, or the flat VMImage shape.

    An empty target name is derived from the source, so repeating the call is idempotent.
    """
    doc = load(image_json, fields.IMAGE)
    source = _image_source(doc)
    if not (source.path or source.url or source.template_name or source.content_library):
        raise invalid(fields.IMAGE, "names no image source (path, url or templateName)")
    name = target_name or _derived_imagechecked_name(source)
    return PrepareImageRequest(
        source=source,
        target_name=checked_name(name, fields.TARGET_NAME),
        storage_hint=as_text(storage_hint, fields.STORAGE_HINT, 1024),
    )


def _image_source(doc: Document) -> ImageSource:
    wrapper = doc.obj("source")
    if wrapper is None:
        flat = vm_image(doc)
        return ImageSource(
            path=flat.path,
            url=flat.url,
            format=flat.format,
            checksum=flat.checksum,
            checksum_type=flat.checksum_type,
            template_name=flat.template_name,
        )
    for origin in ("libvirt", "vsphere", "http"):
        inner = wrapper.obj(origin)
        if inner is None:
            continue
        library = inner.obj("contentLibrary")
        return ImageSource(
            origin=origin,
            path=inner.text("path", 4096),
            url=inner.text("url", 8192) or inner.text("ovaURL", 8192),
            format=inner.text("format", 64),
            checksum=inner.text("checksum", 256),
            checksum_type=inner.text("checksumType", 64),
            storage_pool=inner.text("storagePool", 256),
            template_name=inner.text("templateName", 1024),
            content_library=ContentLibraryItem(
                library=library.text("library", 256),
                item=library.text("item", 256),
                version=library.text("version", 64),
            )
            if library is not None
            else None,
        )
    raise invalid(fields.PREPARE_SOURCE, "must hold one of libvirt, vsphere or http")


def _derived_imagechecked_name(source: ImageSource) -> str:
    basis = source.template_name or source.path or source.url
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", basis.rstrip("/").rsplit("/", 1)[-1])[:48].strip(".-_")
    digest = sha256(basis.encode()).hexdigest()[:8]
    return f"{stem}-{digest}" if stem and stem[0].isalnum() else f"image-{digest}"


def _backend(value: str, field: str) -> TransferBackend:
    try:
        return TransferBackend(value.strip().lower() or TransferBackend.PVC)
    except ValueError:
        raise invalid(field, "must be pvc, nfs or s3") from None


# The manager sends "relay" for its "auto"; older managers sent "auto" or nothing.
_RELAY_SPELLINGS = frozenset({"", "auto", "relay"})


def _mode(value: str, field: str) -> TransferMode:
    spelled = value.strip().lower()
    if spelled in _RELAY_SPELLINGS:
        return TransferMode.RELAY
    try:
        return TransferMode(spelled)
    except ValueError:
        raise invalid(field, "must be auto, relay or direct") from None


def _format(value: str, field: str) -> str:
    disk_format = value.strip().lower() or "qcow2"
    if disk_format not in _DISK_FORMATS:
        raise invalid(field, f"must be one of {', '.join(_DISK_FORMATS)}")
    return disk_format


def _transfer_url(url: str, field: str) -> str:
    if not url:
        raise invalid(field, "must not be empty")
    return as_text(url, field, 8192)


# The manager's StorageOptions keys (Go matches them case-insensitively).
_OPTION_KEYS = (
    "backend",
    "bucket",
    "endpoint",
    "region",
    "prefix",
    "usePathStyle",
    "server",
    "export",
    "path",
    "uid",
    "gid",
)


def _storage_options(text: str) -> dict[str, object]:
    doc = load(text, fields.STORAGE_OPTIONS)
    return {key: doc.raw(key) for key in _OPTION_KEYS if doc.raw(key) is not None}


def _credentials(credentials: Mapping[str, str]) -> dict[str, str]:
    for key in credentials:
        as_text(key, fields.CREDENTIALS, 256)
    return dict(credentials)


def _location(
    field: str,
    url: str,
    backend: TransferBackend,
    options: Mapping[str, object],
    credentials: Mapping[str, str],
) -> StagedLocation:
    """The staged object, checked once here; errors name the wire field or key."""
    result = parse_staged_location(field, url, backend, options, credentials)
    if isinstance(result, Failure):
        raise ExpectedError(result.failure())
    return result.unwrap()


@parser
def parse_export(
    *,
    vm_id: str,
    disk_id: str,
    snapshot_id: str,
    destination_url: str,
    disk_format: str,
    compress: bool,
    credentials: Mapping[str, str],
    backend_type: str,
    transfer_mode: str,
    storage_options_json: str,
) -> ExportRequest:
    backend = _backend(backend_type, fields.BACKEND_TYPE)
    url = _transfer_url(destination_url, fields.DESTINATION_URL)
    options = _storage_options(storage_options_json)
    checked_credentials = _credentials(credentials)
    return ExportRequest(
        vm_id=vm_id,
        disk_id=disk_id,
        snapshot_id=snapshot_id,
        destination_url=url,
        format=_format(disk_format, fields.DISK_FORMAT),
        compress=compress,
        credentials=checked_credentials,
        backend=backend,
        mode=_mode(transfer_mode, fields.TRANSFER_MODE),
        storage_options=options,
        destination=_location(fields.DESTINATION_URL, url, backend, options, checked_credentials),
    )


@parser
def parse_import(
    *,
    source_url: str,
    storage_hint: str,
    disk_format: str,
    target_name: str,
    verify_checksum: bool,
    expected_checksum: str,
    credentials: Mapping[str, str],
    backend_type: str,
    transfer_mode: str,
    storage_options_json: str,
) -> ImportRequest:
    backend = _backend(backend_type, fields.BACKEND_TYPE)
    url = _transfer_url(source_url, fields.SOURCE_URL)
    options = _storage_options(storage_options_json)
    checked_credentials = _credentials(credentials)
    return ImportRequest(
        source_url=url,
        storage_hint=as_text(storage_hint, fields.STORAGE_HINT, 1024),
        format=_format(disk_format, fields.DISK_FORMAT),
        target_name=checked_name(target_name, fields.TARGET_NAME) if target_name else "",
        verify_checksum=verify_checksum,
        expected_checksum=_checksum(expected_checksum),
        credentials=checked_credentials,
        backend=backend,
        mode=_mode(transfer_mode, fields.TRANSFER_MODE),
        storage_options=options,
        source=_location(fields.SOURCE_URL, url, backend, options, checked_credentials),
    )


_SHA256 = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


def _checksum(value: str) -> str:
    """Lowercase hex SHA-256, as ExportDisk answers it; "" when none was sent. A `sha256:`
    prefix (what earlier pyrigaud answered) is dropped."""
    text = as_text(value, fields.EXPECTED_CHECKSUM, 256).strip().lower()
    if not text:
        return ""
    match = _SHA256.fullmatch(text)
    if match is None:
        raise invalid(fields.EXPECTED_CHECKSUM, "must be 64 hex digits (a SHA-256)")
    return match.group(1)


def disk_query(vm_id: str, disk_id: str, snapshot_id: str) -> DiskQuery:
    """GetDiskInfo's ids need no validation: ids that name nothing are simply missing."""
    return DiskQuery(vm_id=vm_id, disk_id=disk_id, snapshot_id=snapshot_id)
