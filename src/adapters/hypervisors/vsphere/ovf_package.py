"""An OVA or OVF fetched for ImagePrepare: downloaded whole into a temporary directory under
the image URL rules, its checksum verified before anything reads it, then opened as a package
(the OVF descriptor and the files it references).

An OVA is a tar holding the descriptor and its disks; they are read from the tar in place, by
exact member name, so nothing in it is ever written out under a name it chose. A bare `.ovf`
names its disks by hrefs relative to its URL; they are fetched next to it under the same rules
(the checksum covers the file the URL names, as upstream's provider does).

What makes a package unusable (a bad download, a damaged tar, a descriptor or href that names
nothing) is a Failure naming the request's field, told where the package is opened or a file
of it read.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter, methodcaller
from pathlib import Path
from typing import IO, TypeVar
from urllib.parse import urljoin, urlsplit

from returns.result import Failure, Result, Success

from pyrigaud.adapters.downloads import (
    Download,
    DownloadFields,
    checksum_algorithm,
    logged_progress,
    open_download,
)
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError

# Finder and AppleDouble litter that macOS leaves in tars; never a descriptor.
IGNORED_PREFIXES = ("__MACOSX/", "._")
MAX_DESCRIPTOR_BYTES = 16 * 1024**2
PACKAGE_FIELDS = DownloadFields(
    fields.PREPARE_OVA_URL,
    fields.PREPARE_CHECKSUM,
    fields.PREPARE_CHECKSUM_TYPE,
    doing="downloading the OVF package",
)

T = TypeVar("T")


@dataclass
class Package:
    """The OVF descriptor and a way to read each file it references, by href."""

    descriptor: str
    _tar: tarfile.TarFile | None = None
    _directory: Path | None = None
    _members: dict[str, tarfile.TarInfo] = field(default_factory=dict)

    def size(self, href: str) -> Result[int, ProviderError]:
        if self._tar is not None:
            return self._member(href).map(attrgetter("size"))
        return self._file(href).map(_file_size)

    def open(self, href: str) -> Result[AbstractContextManager[IO[bytes]], ProviderError]:
        """The referenced file's bytes, read from the tar (OVA) or the fetched file (OVF); a
        tar damaged where the file lies fails its reads, once they are under `read_tar`."""
        tar = self._tar
        if tar is None:
            return self._file(href).map(methodcaller("open", "rb"))

        def extracted(
            member: tarfile.TarInfo,
        ) -> Result[AbstractContextManager[IO[bytes]], ProviderError]:
            reader = tar.extractfile(member)
            if reader is None:
                return Failure(_unusable(f"{href!r} in the OVA is not a regular file"))
            return Success(reader)

        return self._member(href).bind(extracted)

    def _member(self, href: str) -> Result[tarfile.TarInfo, ProviderError]:
        member = self._members.get(href.removeprefix("./"))
        if member is None:
            return Failure(
                _unusable(f"the OVA holds no file {href!r} that its descriptor references")
            )
        return Success(member)

    def _file(self, href: str) -> Result[Path, ProviderError]:
        directory = self._directory
        assert directory is not None
        return _local_name(href).map(directory.joinpath)


def fetched_package(
    url: str,
    *,
    checksum: str,
    checksum_type: str,
    allow_loopback: bool,
    holds: contextlib.ExitStack,
) -> Result[Package, ProviderError]:
    """The package at `url`, downloaded and verified; its temporary files are deleted when
    `holds` close."""

    def fetch(_: object) -> Result[Package, ProviderError]:
        directory = Path(holds.enter_context(tempfile.TemporaryDirectory(prefix="pyrigaud-ova-")))
        is_ovf = urlsplit(url).path.lower().endswith(".ovf")
        main = directory / ("package.ovf" if is_ovf else "package.ova")
        downloaded = _download(url, main, checksum, checksum_type, allow_loopback)
        if is_ovf:

            def descriptor_read(_downloaded: None) -> Result[str, ProviderError]:
                return _descriptor_text(main.read_bytes())

            def package(descriptor: str) -> Package:
                return Package(descriptor=descriptor, _directory=directory)

            return downloaded.bind(descriptor_read).map(package)

        def tar_read(_downloaded: None) -> Result[Package, ProviderError]:
            return read_tar(partial(_tar_package, holds, main))

        return downloaded.bind(tar_read)

    return checksum_algorithm(checksum_type, PACKAGE_FIELDS.checksum_type).bind(fetch)


def fetch_referenced(
    package: Package, url: str, hrefs: list[str], *, allow_loopback: bool
) -> Result[None, ProviderError]:
    """Fetch a bare OVF's referenced files next to it (nothing to do for an OVA)."""
    if package._directory is None:
        return Success(None)

    def fetch(href: str) -> Result[None, ProviderError]:
        return package._file(href).bind(
            partial(
                _download,
                urljoin(url, href),
                checksum="",
                checksum_type="",
                loopback=allow_loopback,
            )
        )

    for href in hrefs:
        match fetch(href):
            case Failure() as failed:
                return failed
    return Success(None)


def read_tar(action: Callable[[], Result[T, ProviderError]]) -> Result[T, ProviderError]:
    """`action()`, reading the OVA: a tar damaged where it reads (the headers, a member's
    data) makes the package unusable."""
    try:
        return action()
    except tarfile.TarError as error:
        return Failure(_unusable(f"the OVA is not a readable tar archive: {error}"))


def _download(
    url: str, target: Path, checksum: str, checksum_type: str, loopback: bool
) -> Result[None, ProviderError]:
    """The file at `url` written whole to `target`, its checksum verified."""

    def written(download: Download) -> Result[None, ProviderError]:
        label = f"OVF package {target.name}"
        with contextlib.closing(download), target.open("wb") as out:
            return download.chunks.consumed_by(
                partial(_logged_into, out, label=label, length=download.length)
            )

    return open_download(
        url,
        checksum=checksum,
        checksum_type=checksum_type,
        allow_loopback=loopback,
        named=PACKAGE_FIELDS,
    ).bind(written)


def _logged_into(out: IO[bytes], chunks: Iterator[bytes], label: str, length: int | None) -> None:
    """Every chunk written to `out`, its progress logged."""
    out.writelines(logged_progress(chunks, label, length))


def _tar_package(holds: contextlib.ExitStack, path: Path) -> Result[Package, ProviderError]:
    tar = holds.enter_context(tarfile.open(path, mode="r:"))  # noqa: SIM115 (the holds close it)
    members = {
        member.name.removeprefix("./"): member
        for member in tar.getmembers()
        if member.isfile() and not member.name.removeprefix("./").startswith(IGNORED_PREFIXES)
    }
    descriptors = [name for name in members if name.lower().endswith(".ovf")]
    if not descriptors:
        return Failure(_unusable("the OVA holds no .ovf descriptor"))
    reader = tar.extractfile(members[descriptors[0]])
    assert reader is not None  # a regular file, checked above
    with reader:
        data = reader.read(MAX_DESCRIPTOR_BYTES + 1)

    def package(descriptor: str) -> Package:
        return Package(descriptor=descriptor, _tar=tar, _members=members)

    return _descriptor_text(data).map(package)


def _file_size(path: Path) -> int:
    return path.stat().st_size


def _descriptor_text(data: bytes) -> Result[str, ProviderError]:
    if len(data) > MAX_DESCRIPTOR_BYTES:
        return Failure(_unusable("the OVF descriptor is larger than 16 MiB"))
    try:
        return Success(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        return Failure(_unusable("the OVF descriptor is not UTF-8 text"))


def _local_name(href: str) -> Result[str, ProviderError]:
    """A referenced file's name in the scratch directory: its last path segment only."""
    name = os.path.basename(urlsplit(href).path)
    if not name or name in {".", ".."}:
        return Failure(_unusable(f"the descriptor references {href!r}, which names no file"))
    return Success(name)


def _unusable(problem: str) -> ProviderError:
    return ProviderError.invalid_spec(fields.PREPARE_OVA_URL, problem)
