"""ImagePrepare and disk-transfer (ExportDisk, ImportDisk, GetDiskInfo) payloads -> domain.

ImagePrepare sends the CRD's camelCase image source; the transfers name a staging type
(`backend_type`: what `adapters/staging/registry.py` lists), a transfer mode and free-form
storage options, which that type's rules read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from hashlib import sha256

from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.registry import (
    DEFAULT_STAGING_TYPE,
    known_types,
    option_keys,
    parse_staged_location,
    staging_rules,
)
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    ContentLibraryItem,
    DiskQuery,
    ExportRequest,
    ImageSource,
    ImportRequest,
    PrepareImageRequest,
    TransferMode,
)
from pyrigaud.domain.staging import StagingType
from pyrigaud.entrypoints.grpc.wire import field_names as names
from pyrigaud.entrypoints.grpc.wire.document import (
    Document,
    as_text,
    checked_name,
    each,
    invalid,
    load,
)
from pyrigaud.entrypoints.grpc.wire.vm_requests import vm_image

_DISK_FORMATS = ("qcow2", "raw", "vmdk")


def parse_prepare_image(
    *, image_json: str, target_name: str, storage_hint: str
) -> Result[PrepareImageRequest, ProviderError]:
    """The CRD's `{"source": {"libvirt"|"vsphere"|"http": {...}}}`, or the flat VMImage shape.

    An empty target name is derived from the source, so repeating the call is idempotent.
    """
    return Result.do(
        PrepareImageRequest(source=source, target_name=name, storage_hint=hint)
        for source in load(image_json, names.IMAGE).bind(_image_source).bind(_named_source)
        for name in checked_name(target_name or _derived_image_name(source), names.TARGET_NAME)
        for hint in as_text(storage_hint, names.STORAGE_HINT, 1024)
    )


def _named_source(source: ImageSource) -> Result[ImageSource, ProviderError]:
    if not (source.path or source.url or source.template_name or source.content_library):
        return invalid(names.IMAGE, "names no image source (path, url or templateName)")
    return Success(source)


def _image_source(doc: Document) -> Result[ImageSource, ProviderError]:
    match doc.obj("source"):
        case Failure() as failed:
            return failed
        case Success(None):
            return Result.do(
                ImageSource(
                    path=flat.path,
                    url=flat.url,
                    format=flat.format,
                    checksum=flat.checksum,
                    checksum_type=flat.checksum_type,
                    template_name=flat.template_name,
                )
                for flat in vm_image(doc)
            )
        case Success(Document() as wrapper):
            pass
    for origin in ("libvirt", "vsphere", "http"):
        match wrapper.obj(origin):
            case Failure() as failed:
                return failed
            case Success(Document() as inner):
                return _origin_source(origin, inner)
    return invalid(names.PREPARE_SOURCE, "must hold one of libvirt, vsphere or http")


def _origin_source(origin: str, inner: Document) -> Result[ImageSource, ProviderError]:
    return Result.do(
        ImageSource(
            origin=origin,
            path=path,
            url=url or ova_url,
            format=image_format,
            checksum=checksum,
            checksum_type=checksum_type,
            storage_pool=storage_pool,
            template_name=template_name,
            content_library=content_library,
        )
        for library in inner.obj("contentLibrary")
        for path in inner.text("path", 4096)
        for url in inner.text("url", 8192)
        for ova_url in (inner.text("ovaURL", 8192) if not url else Success(""))
        for image_format in inner.text("format", 64)
        for checksum in inner.text("checksum", 256)
        for checksum_type in inner.text("checksumType", 64)
        for storage_pool in inner.text("storagePool", 256)
        for template_name in inner.text("templateName", 1024)
        for content_library in _content_library(library)
    )


def _content_library(library: Document | None) -> Result[ContentLibraryItem | None, ProviderError]:
    if library is None:
        return Success(None)
    return Result.do(
        ContentLibraryItem(library=name, item=item, version=version)
        for name in library.text("library", 256)
        for item in library.text("item", 256)
        for version in library.text("version", 64)
    )


def _derived_image_name(source: ImageSource) -> str:
    basis = source.template_name or source.path or source.url
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", basis.rstrip("/").rsplit("/", 1)[-1])[:48].strip(".-_")
    digest = sha256(basis.encode()).hexdigest()[:8]
    return f"{stem}-{digest}" if stem and stem[0].isalnum() else f"image-{digest}"


def _backend(value: str, field: str) -> Result[StagingType, ProviderError]:
    named = StagingType(value.strip().lower() or DEFAULT_STAGING_TYPE)
    if staging_rules(named) is None:
        return invalid(field, f"must be {known_types()}")
    return Success(named)


# The manager sends "relay" for its "auto"; older managers sent "auto" or nothing.
_RELAY_SPELLINGS = frozenset({"", "auto", "relay"})


def _mode(value: str, field: str) -> Result[TransferMode, ProviderError]:
    spelled = value.strip().lower()
    if spelled in _RELAY_SPELLINGS:
        return Success(TransferMode.RELAY)
    try:
        return Success(TransferMode(spelled))
    except ValueError:
        return invalid(field, "must be auto, relay or direct")


def _format(value: str, field: str) -> Result[str, ProviderError]:
    disk_format = value.strip().lower() or "qcow2"
    if disk_format not in _DISK_FORMATS:
        return invalid(field, f"must be one of {', '.join(_DISK_FORMATS)}")
    return Success(disk_format)


def _transfer_url(url: str, field: str) -> Result[str, ProviderError]:
    if not url:
        return invalid(field, "must not be empty")
    return as_text(url, field, 8192)


def _storage_options(text: str) -> Result[dict[str, object], ProviderError]:
    """The manager's StorageOptions keys that some staging type reads (Go matches them
    case-insensitively)."""
    return Result.do(
        {key: doc.raw(key) for key in option_keys() if doc.raw(key) is not None}
        for doc in load(text, names.STORAGE_OPTIONS)
    )


def _credentials(credentials: Mapping[str, str]) -> Result[dict[str, str], ProviderError]:
    return Result.do(
        dict(credentials)
        for _ in each(credentials, partial(as_text, field=names.CREDENTIALS, limit=256))
    )


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
) -> Result[ExportRequest, ProviderError]:
    """The staged location is checked once here; errors name the wire field or key."""
    return Result.do(
        ExportRequest(
            vm_id=vm_id,
            disk_id=disk_id,
            snapshot_id=snapshot_id,
            format=checked_format,
            compress=compress,
            mode=mode,
            destination=destination,
        )
        for backend in _backend(backend_type, names.BACKEND_TYPE)
        for url in _transfer_url(destination_url, names.DESTINATION_URL)
        for options in _storage_options(storage_options_json)
        for checked_credentials in _credentials(credentials)
        for checked_format in _format(disk_format, names.DISK_FORMAT)
        for mode in _mode(transfer_mode, names.TRANSFER_MODE)
        for destination in parse_staged_location(
            fields.DESTINATION_URL, url, backend, options, checked_credentials
        )
    )


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
) -> Result[ImportRequest, ProviderError]:
    """The staged location is checked once here; errors name the wire field or key."""
    return Result.do(
        ImportRequest(
            storage_hint=hint,
            format=checked_format,
            target_name=target_name,  # checked by ImportDisk, which also names a disk without one
            verify_checksum=verify_checksum,
            expected_checksum=checksum,
            mode=mode,
            source=source,
        )
        for backend in _backend(backend_type, names.BACKEND_TYPE)
        for url in _transfer_url(source_url, names.SOURCE_URL)
        for options in _storage_options(storage_options_json)
        for checked_credentials in _credentials(credentials)
        for hint in as_text(storage_hint, names.STORAGE_HINT, 1024)
        for checked_format in _format(disk_format, names.DISK_FORMAT)
        for checksum in _checksum(expected_checksum)
        for mode in _mode(transfer_mode, names.TRANSFER_MODE)
        for source in parse_staged_location(
            fields.SOURCE_URL, url, backend, options, checked_credentials
        )
    )


_SHA256 = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


def _checksum(value: str) -> Result[str, ProviderError]:
    """Lowercase hex SHA-256, as ExportDisk answers it; "" when none was sent. A `sha256:`
    prefix (what earlier pyrigaud answered) is dropped."""

    def checked(given: str) -> Result[str, ProviderError]:
        text = given.strip().lower()
        if not text:
            return Success("")
        found = _SHA256.fullmatch(text)
        if found is None:
            return invalid(names.EXPECTED_CHECKSUM, "must be 64 hex digits (a SHA-256)")
        return Success(found.group(1))

    return as_text(value, names.EXPECTED_CHECKSUM, 256).bind(checked)


def disk_query(vm_id: str, disk_id: str, snapshot_id: str) -> DiskQuery:
    """GetDiskInfo's ids need no validation: ids that name nothing are simply missing."""
    return DiskQuery(vm_id=vm_id, disk_id=disk_id, snapshot_id=snapshot_id)
