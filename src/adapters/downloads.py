"""Fetching a file over http(s) as chunks, checked against the image URL rules and a checksum.

Shared by the backends that download images (libvirt volumes, vSphere OVA/OVF imports). The
connection goes to the address `pinning.pinned_address` checked and chose (TLS still verifies
the certificate for the name). A re-check after connecting would also work, but pinning leaves
no window for a DNS answer that changes between the check and the connect. Redirects are
followed a few times, each target checked the same way.

Every expected failure is a value naming the request field at fault (`DownloadFields`): a
refused URL or checksum type when the download opens, a cut transfer or a checksum that does
not match as the outcome of its chunks (`Download.chunks`, read to the end first).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

from returns.result import Failure, Result, Success

from pyrigaud.adapters.pinning import pinned_address
from pyrigaud.domain.chunks import Chunks
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.image_urls import ImageURL, address_allowed, parse_image_url

CHUNK_BYTES = 1024 * 1024
TIMEOUT_SECONDS = 30.0
MAX_REDIRECTS = 5
CHECKSUM_TYPES = ("md5", "sha1", "sha256", "sha512")
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
PROGRESS_EVERY_BYTES = 256 * 1024**2

logger = logging.getLogger(__name__)

# A GET's response, its headers read: the URL it answered and the connection it came on.
Answer = tuple[ImageURL, http.client.HTTPConnection, http.client.HTTPResponse]


@dataclass(frozen=True)
class DownloadFields:
    """The request fields a download's problems are named by, and what a transfer that fails
    was doing, for its message (none: the server's answer alone)."""

    url: str
    checksum: str
    checksum_type: str
    doing: str = ""

    def unavailable(self, problem: str) -> ProviderError:
        """The server could not give the file (status, connection); retrying may help."""
        return ProviderError.unavailable(f"{self.doing}: {problem}" if self.doing else problem)


@dataclass(frozen=True)
class Download:
    """An open response: its length when the server said, and its verified body.

    Iterating `chunks` to the end closes the connection, and consuming them (`consumed_by`)
    answers whether they were the whole file the spec described; `close` closes one left unread.
    """

    length: int | None
    chunks: Chunks[bytes]
    connection: http.client.HTTPConnection

    def close(self) -> None:
        self.connection.close()


def open_download(
    url: str, *, checksum: str, checksum_type: str, allow_loopback: bool, named: DownloadFields
) -> Result[Download, ProviderError]:
    """Connect and read the headers, following redirects, each target checked."""

    def opened(algorithm: str) -> Result[Download, ProviderError]:
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            match _answer(current, allow_loopback, named):
                case Failure() as failed:
                    return failed
                case Success((target, connection, response)):
                    location = response.getheader("Location")
                    if response.status in REDIRECT_STATUSES and location:
                        connection.close()
                        current = _absolute(target, location)
                        continue
                    if response.status != 200:
                        connection.close()
                        answered = f"{target.host} answered HTTP {response.status}"
                        return Failure(named.unavailable(answered))
                    length = response.getheader("Content-Length")
                    body = _verified_chunks(
                        connection, response, algorithm, checksum.strip().lower(), named
                    )
                    return Success(
                        Download(
                            length=int(length) if length and length.isdigit() else None,
                            chunks=Chunks(body),
                            connection=connection,
                        )
                    )
        return Failure(named.unavailable(f"more than {MAX_REDIRECTS} redirects from {url!r}"))

    return checksum_algorithm(checksum_type, named.checksum_type).bind(opened)


def checksum_algorithm(checksum_type: str, field: str) -> Result[str, ProviderError]:
    """The hashlib name of a spec's checksum type (sha256 when unset); another is an invalid
    spec of `field`."""
    algorithm = (checksum_type or "sha256").lower()
    if algorithm not in CHECKSUM_TYPES:
        return Failure(
            ProviderError.invalid_spec(
                field, f"checksum type {checksum_type!r} is not one of {', '.join(CHECKSUM_TYPES)}"
            )
        )
    return Success(algorithm)


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


def _answer(url: str, allow_loopback: bool, named: DownloadFields) -> Result[Answer, ProviderError]:
    """The response to a GET of `url`, its headers read, over a connection pinned to a
    checked address."""

    def requested(
        target: ImageURL, connection: http.client.HTTPConnection
    ) -> Result[
        tuple[ImageURL, http.client.HTTPConnection, http.client.HTTPResponse], ProviderError
    ]:
        try:
            connection.request("GET", target.target, headers={"User-Agent": "pyrigaud"})
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            return Failure(named.unavailable(f"fetching {target.host}: {error}"))
        return Success((target, connection, response))

    return Result.do(
        answer
        for target in parse_image_url(url, named.url)
        for connection in _pinned_connection(target, allow_loopback, named)
        for answer in requested(target, connection)
    )


def _pinned_connection(
    target: ImageURL, allow_loopback: bool, named: DownloadFields
) -> Result[http.client.HTTPConnection, ProviderError]:
    def refusal(address: str) -> ProviderError | None:
        allowed = address_allowed(address, allow_loopback=allow_loopback, field=named.url)
        return allowed.swap().value_or(None)

    def connection(address: str) -> http.client.HTTPConnection:
        if target.scheme == "https":
            return _PinnedHTTPSConnection(target.host, target.port, address)
        return _PinnedHTTPConnection(target.host, target.port, address)

    return pinned_address(target.host, target.port, refusal, named.unavailable).map(connection)


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
    named: DownloadFields,
) -> Iterator[Result[bytes, ProviderError]]:
    """The body, the connection closed after its last chunk; a read that fails ends it, and
    so do bytes that are not the expected image, after the last."""
    digest = hashlib.new(algorithm)
    with contextlib.closing(connection):
        while True:
            match _read(response, named):
                case Success(b""):
                    break
                case Success(chunk):
                    digest.update(chunk)
                    yield Success(chunk)
                case Failure() as failed:
                    yield failed
                    return
    if expected and digest.hexdigest() != expected:
        yield Failure(
            ProviderError.invalid_spec(
                named.checksum,
                f"the {algorithm} of the downloaded image is {digest.hexdigest()}, not {expected}",
            )
        )


def _read(
    response: http.client.HTTPResponse, named: DownloadFields
) -> Result[bytes, ProviderError]:
    """The body's next chunk (empty at its end)."""
    try:
        return Success(response.read(CHUNK_BYTES))
    except (OSError, http.client.HTTPException) as error:
        return Failure(named.unavailable(f"reading the image: {error}"))


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
