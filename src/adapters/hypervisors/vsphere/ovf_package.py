"""An OVA or OVF fetched for ImagePrepare: downloaded whole into a temporary directory under
the image URL rules, its checksum verified before anything reads it, then opened as a package
(the OVF descriptor and the files it references).

An OVA is a tar holding the descriptor and its disks; they are read from the tar in place, by
exact member name, so nothing in it is ever written out under a name it chose. A bare `.ovf`
names its disks by hrefs relative to its URL; they are fetched next to it under the same rules
(the checksum covers the file the URL names, as upstream's provider does).
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urljoin, urlsplit

from pyrigaud.adapters.downloads import (
    ChecksumMismatchError,
    DownloadError,
    UnknownChecksumTypeError,
    checksum_algorithm,
    logged_progress,
    open_download,
)
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.image_urls import UnsafeImageURLError

# Finder and AppleDouble litter that macOS leaves in tars; never a descriptor.
IGNORED_PREFIXES = ("__MACOSX/", "._")
MAX_DESCRIPTOR_BYTES = 16 * 1024**2


@dataclass
class Package:
    """The OVF descriptor and a way to read each file it references, by href."""

    descriptor: str
    _tar: tarfile.TarFile | None = None
    _directory: Path | None = None
    _members: dict[str, tarfile.TarInfo] = field(default_factory=dict)

    def size(self, href: str) -> int:
        if self._tar is not None:
            return self._member(href).size
        return self._file(href).stat().st_size

    @contextlib.contextmanager
    def open(self, href: str) -> Iterator[IO[bytes]]:
        """The referenced file's bytes, read from the tar (OVA) or the fetched file (OVF)."""
        if self._tar is not None:
            reader = self._tar.extractfile(self._member(href))
            if reader is None:
                raise _unusable(f"{href!r} in the OVA is not a regular file")
            with reader:
                yield reader
            return
        with self._file(href).open("rb") as reader:
            yield reader

    def _member(self, href: str) -> tarfile.TarInfo:
        member = self._members.get(href.removeprefix("./"))
        if member is None:
            raise _unusable(f"the OVA holds no file {href!r} that its descriptor references")
        return member

    def _file(self, href: str) -> Path:
        assert self._directory is not None
        return self._directory / _local_name(href)


@contextlib.contextmanager
def fetched_package(
    url: str,
    *,
    checksum: str,
    checksum_type: str,
    allow_loopback: bool,
) -> Iterator[Package]:
    """The package at `url`, downloaded and verified; the temporary files are deleted when
    the block ends, whatever happens in it."""
    with _spec_errors():
        checksum_algorithm(checksum_type)
    with tempfile.TemporaryDirectory(prefix="pyrigaud-ova-") as scratch:
        directory = Path(scratch)
        is_ovf = urlsplit(url).path.lower().endswith(".ovf")
        main = directory / ("package.ovf" if is_ovf else "package.ova")
        with _spec_errors():
            _download(url, main, checksum, checksum_type, allow_loopback)
        if is_ovf:
            descriptor = _descriptor_text(main.read_bytes())
            package = Package(descriptor=descriptor, _directory=directory)
            yield package
            return
        with _opened_tar(main) as tar:
            yield _tar_package(tar)


def fetch_referenced(package: Package, url: str, hrefs: list[str], *, allow_loopback: bool) -> None:
    """Fetch a bare OVF's referenced files next to it (nothing to do for an OVA)."""
    if package._directory is None:
        return
    for href in hrefs:
        with _spec_errors():
            _download(urljoin(url, href), package._file(href), "", "", allow_loopback)


def _download(url: str, target: Path, checksum: str, checksum_type: str, loopback: bool) -> None:
    download = open_download(
        url, checksum=checksum, checksum_type=checksum_type, allow_loopback=loopback
    )
    with contextlib.closing(download), target.open("wb") as out:
        for chunk in logged_progress(
            download.chunks, f"OVF package {target.name}", download.length
        ):
            out.write(chunk)


@contextlib.contextmanager
def _opened_tar(path: Path) -> Iterator[tarfile.TarFile]:
    """The OVA as a tar; a damaged one (here or while its members are read) is unusable."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            yield tar
    except tarfile.TarError as error:
        raise _unusable(f"the OVA is not a readable tar archive: {error}") from error


def _tar_package(tar: tarfile.TarFile) -> Package:
    members = {
        member.name.removeprefix("./"): member
        for member in tar.getmembers()
        if member.isfile() and not member.name.removeprefix("./").startswith(IGNORED_PREFIXES)
    }
    descriptors = [name for name in members if name.lower().endswith(".ovf")]
    if not descriptors:
        raise _unusable("the OVA holds no .ovf descriptor")
    reader = tar.extractfile(members[descriptors[0]])
    assert reader is not None  # a regular file, checked above
    with reader:
        data = reader.read(MAX_DESCRIPTOR_BYTES + 1)
    return Package(descriptor=_descriptor_text(data), _tar=tar, _members=members)


def _descriptor_text(data: bytes) -> str:
    if len(data) > MAX_DESCRIPTOR_BYTES:
        raise _unusable("the OVF descriptor is larger than 16 MiB")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise _unusable("the OVF descriptor is not UTF-8 text") from error


def _local_name(href: str) -> str:
    """A referenced file's name in the scratch directory: its last path segment only."""
    name = os.path.basename(urlsplit(href).path)
    if not name or name in {".", ".."}:
        raise _unusable(f"the descriptor references {href!r}, which names no file")
    return name


def _unusable(problem: str) -> ExpectedError:
    return ExpectedError(ProviderError.invalid_spec(fields.PREPARE_OVA_URL, problem))


@contextlib.contextmanager
def _spec_errors() -> Iterator[None]:
    """The download's failures as ProviderErrors naming the request's fields."""
    try:
        yield
    except UnsafeImageURLError as error:
        raise ExpectedError(
            ProviderError.invalid_spec(fields.PREPARE_OVA_URL, str(error))
        ) from None
    except UnknownChecksumTypeError as error:
        raise ExpectedError(
            ProviderError.invalid_spec(fields.PREPARE_CHECKSUM_TYPE, str(error))
        ) from None
    except ChecksumMismatchError as error:
        raise ExpectedError(
            ProviderError.invalid_spec(fields.PREPARE_CHECKSUM, str(error))
        ) from None
    except DownloadError as error:
        raise ExpectedError(
            ProviderError.unavailable(f"downloading the OVF package: {error}")
        ) from None
