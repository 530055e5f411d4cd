"""Fetching a file over http(s) as chunks, checked against the image URL rules and a checksum.

Shared by the backends that download images (libvirt volumes, vSphere OVA/OVF imports). The
host name is resolved once, every address it resolves to is checked, and the connection is
pinned to the first checked address (TLS still verifies the certificate for the name). A
re-check after connecting would also work, but pinning leaves no window for a DNS answer that
changes between the check and the connect. Redirects are followed a few times, each target
checked the same way.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

from pyrigaud.domain.image_urls import ImageURL, address_problem_or_raise, parse_image_url

CHUNK_BYTES = 1024 * 1024
TIMEOUT_SECONDS = 30.0
MAX_REDIRECTS = 5
CHECKSUM_TYPES = ("md5", "sha1", "sha256", "sha512")
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
PROGRESS_EVERY_BYTES = 256 * 1024**2

logger = logging.getLogger(__name__)


class DownloadError(Exception):
    """The server could not give the file (status, connection); retrying may help."""


class ChecksumMismatchError(Exception):
    """The bytes received are not the file the spec described."""


class UnknownChecksumTypeError(ValueError):
    """The spec names a checksum type this module cannot compute."""


@dataclass(frozen=True)
class Download:
    """An open response: its length when the server said, and its verified body.

    Iterating `chunks` to the end closes the connection; `close` does it for one left unread.
    """

    length: int | None
    chunks: Iterator[bytes]
    connection: http.client.HTTPConnection

    def close(self) -> None:
        self.connection.close()


def open_download(url: str, *, checksum: str, checksum_type: str, allow_loopback: bool) -> Download:
    """Connect and read the headers; raises UnsafeImageURLError, DownloadError or
    UnknownChecksumTypeError (a ValueError)."""
    algorithm = checksum_algorithm(checksum_type)
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        target = parse_image_url(current)
        connection = _pinned_connection(target, allow_loopback=allow_loopback)
        try:
            connection.request("GET", target.target, headers={"User-Agent": "pyrigaud"})
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise DownloadError(f"fetching {target.host}: {error}") from error
        location = response.getheader("Location")
        if response.status in REDIRECT_STATUSES and location:
            connection.close()
            current = _absolute(target, location)
            continue
        if response.status != 200:
            connection.close()
            raise DownloadError(f"{target.host} answered HTTP {response.status}")
        length = response.getheader("Content-Length")
        return Download(
            length=int(length) if length and length.isdigit() else None,
            chunks=_verified_chunks(connection, response, algorithm, checksum.strip().lower()),
            connection=connection,
        )
    raise DownloadError(f"more than {MAX_REDIRECTS} redirects from {url!r}")


def checksum_algorithm(checksum_type: str) -> str:
    """The hashlib name of a spec's checksum type (sha256 when unset)."""
    algorithm = (checksum_type or "sha256").lower()
    if algorithm not in CHECKSUM_TYPES:
        raise UnknownChecksumTypeError(
            f"checksum type {checksum_type!r} is not one of {', '.join(CHECKSUM_TYPES)}"
        )
    return algorithm


def logged_progress(chunks: Iterator[bytes], label: str, length: int | None) -> Iterator[bytes]:
    """The same chunks, with a log line at every PROGRESS_EVERY_BYTES: a long download shows
    it is alive. The label names what is being made, never the URL (it may carry a token)."""
    of_total = f" of {length // 2**20} MiB" if length else ""
    done = 0
    for chunk in chunks:
        before, done = done, done + len(chunk)
        if done // PROGRESS_EVERY_BYTES > before // PROGRESS_EVERY_BYTES:
            logger.info("downloading %s: %d MiB%s", label, done // 2**20, of_total)
        yield chunk


def _pinned_connection(target: ImageURL, *, allow_loopback: bool) -> http.client.HTTPConnection:
    addresses = _resolve(target)
    for address in addresses:
        address_problem_or_raise(address, allow_loopback=allow_loopback)
    if target.scheme == "https":
        return _PinnedHTTPSConnection(target.host, target.port, addresses[0])
    return _PinnedHTTPConnection(target.host, target.port, addresses[0])


def _resolve(target: ImageURL) -> list[str]:
    try:
        found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise DownloadError(f"cannot resolve {target.host!r}: {error}") from error
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not addresses:
        raise DownloadError(f"{target.host!r} resolves to no address")
    return addresses


def _absolute(base: ImageURL, location: str) -> str:
    if "://" in location:
        return location
    host = f"[{base.host}]" if ":" in base.host else base.host
    path = location if location.startswith("/") else f"/{location}"
    return f"{base.scheme}://{host}:{base.port}{path}"


def _verified_chunks(
    connection: http.client.HTTPConnection,
    response: http.client.HTTPResponse,
    algorithm: str,
    expected: str,
) -> Iterator[bytes]:
    """The body; after the last chunk, ChecksumMismatchError if it is not the expected image."""
    digest = hashlib.new(algorithm)
    try:
        while chunk := response.read(CHUNK_BYTES):
            digest.update(chunk)
            yield chunk
    except (OSError, http.client.HTTPException) as error:
        raise DownloadError(f"reading the image: {error}") from error
    finally:
        connection.close()
    if expected and digest.hexdigest() != expected:
        raise ChecksumMismatchError(
            f"the {algorithm} of the downloaded image is {digest.hexdigest()}, not {expected}"
        )


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, address: str) -> None:
        super().__init__(host, port, timeout=TIMEOUT_SECONDS)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), TIMEOUT_SECONDS)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=TIMEOUT_SECONDS, context=self._tls)
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), TIMEOUT_SECONDS)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)
