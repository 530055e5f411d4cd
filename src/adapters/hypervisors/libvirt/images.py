"""ImagePrepare on libvirt: an image made a volume in a storage pool, once per target name.

From a volume already in a pool (copied), a file on the libvirt host (uploaded), or an
http(s) URL (downloaded, its checksum verified, its format checked before a byte is stored).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from functools import partial
from typing import Any

from returns.result import Failure, Result, Success

from pyrigaud.adapters.downloads import Download
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.image_sources import (
    PREPARE_FIELDS,
    ImageDownloads,
    JudgedBody,
    declared_format,
)
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    VolumeFacts,
    copy_volume_into,
    find_pool,
    find_volume,
    volume_facts,
    volume_xml,
    write_new_volume,
)
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import ImageSource, PreparedImage, PrepareImageRequest

# A file on this host: its problems are named by the request's path.
FILE_FIELDS = dataclasses.replace(PREPARE_FIELDS, url=fields.PREPARE_PATH)
FILE_CHUNK_BYTES = 1024 * 1024


class LibvirtImages:
    def __init__(self, host: LibvirtHost, downloads: ImageDownloads) -> None:
        self._host = host
        self._downloads = downloads

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        return self._host.run(
            f"prepare image {request.target_name!r}",
            partial(self._prepare_image, request=request),
        )

    def _prepare_image(
        self, conn: VirConnect, request: PrepareImageRequest
    ) -> Result[PreparedImage, ProviderError]:
        source = request.source
        if source.template_name or source.content_library:
            return Failure(
                ProviderError.invalid_spec(
                    fields.PREPARE_TEMPLATE_NAME, "libvirt has no templates; give a path or url"
                )
            )
        origin = volume_facts(conn, source.path) if source.path else None
        pools = self._host.pools
        pool_name = request.storage_hint or source.storage_pool or pools.default_pool
        field = fields.STORAGE_HINT if request.storage_hint else fields.PREPARE_STORAGE_POOL

        def prepared(image_format: str, pool: Any) -> Result[str, ProviderError]:
            name = f"{request.target_name}.{image_format}"
            existing = find_volume(pool, name)
            if existing is not None:
                return Success(existing)
            if origin is not None:
                return copy_volume_into(conn, pool, origin.path, name)
            if source.path:
                return self._import_file(conn, pool, name, image_format, source)
            return self._import_url(conn, pool, name, image_format, request)

        return Result.do(
            PreparedImage(id=request.target_name, path=path)
            for image_format in _image_format(source.format, origin, source.url)
            for pool in find_pool(conn, pool_name, pools, field)
            for path in prepared(image_format, pool)
        )

    def _import_file(
        self, conn: VirConnect, pool: Any, name: str, image_format: str, source: ImageSource
    ) -> Result[str, ProviderError]:
        """A file on this host, judged as it is read, like a downloaded image."""
        file_path = source.path
        if not os.path.isabs(file_path) or not os.path.isfile(file_path):
            return Failure(
                ProviderError.invalid_spec(
                    fields.PREPARE_PATH,
                    f"{file_path!r} is neither a volume in a storage pool nor a file on this host",
                )
            )
        size = os.path.getsize(file_path)
        xml = volume_xml(name, size, volume_format=image_format)

        def written(body: JudgedBody) -> Result[str, ProviderError]:
            return body.stored(
                conn, partial(write_new_volume, conn, pool, xml, writer=self._host.write_volume)
            )

        return self._downloads.judged(
            _file_chunks(file_path), size, image_format, FILE_FIELDS
        ).bind(written)

    def _import_url(
        self,
        conn: VirConnect,
        pool: Any,
        name: str,
        image_format: str,
        request: PrepareImageRequest,
    ) -> Result[str, ProviderError]:
        source = request.source

        def downloaded(download: Download) -> Result[str, ProviderError]:
            def written(body: JudgedBody) -> Result[str, ProviderError]:
                xml = volume_xml(name, download.length or 0, volume_format=image_format)
                label = f"image {request.target_name!r}"
                return self._downloads.write(
                    conn, pool, xml, download, named=PREPARE_FIELDS, label=label, body=body
                )

            with contextlib.closing(download):
                # Judged before a byte is stored: a qcow2 naming a backing file would hand a
                # host file to every VM made from this image.
                return self._downloads.judged(
                    download.chunks, download.length, image_format, PREPARE_FIELDS
                ).bind(written)

        return self._downloads.open(
            source.url, source.checksum, source.checksum_type, PREPARE_FIELDS
        ).bind(downloaded)


def _image_format(given: str, origin: VolumeFacts | None, url: str) -> Result[str, ProviderError]:
    """The prepared volume's format: as told, else the source volume's, else from the URL."""

    def told_or_unspecified(chosen: str) -> str:
        return chosen or _unspecified_format(origin, url)

    return declared_format(given, PREPARE_FIELDS.format).map(told_or_unspecified)


def _unspecified_format(origin: VolumeFacts | None, url: str) -> str:
    if origin is not None:
        return origin.format
    return "raw" if url.split("?", 1)[0].endswith((".raw", ".img")) else "qcow2"


def _file_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as image:
        while chunk := image.read(FILE_CHUNK_BYTES):
            yield chunk
