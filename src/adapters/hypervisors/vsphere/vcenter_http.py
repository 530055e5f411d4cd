"""Plain HTTP requests to vCenter beside the SOAP session (NFC lease URLs, datastore file
access): the same endpoint, TLS settings and session cookie, so they need no login of their
own and trust exactly what the session trusts."""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit


@contextlib.contextmanager
def opened_request(
    stub: Any, method: str, url: str, headers: Mapping[str, str]
) -> Iterator[http.client.HTTPConnection]:
    """A connection with the request line and headers sent, for the block to send the body
    (if any) and read the answer; closed when the block ends, or when sending the head
    failed. `url` may be a path alone, or name `*` as its host as vCenter's lease URLs do:
    both mean the endpoint the session talks to."""
    parts = urlsplit(url)
    host = stub.host if parts.hostname in (None, "*") else parts.netloc
    connection: http.client.HTTPConnection = stub.scheme(host, **stub.schemeArgs)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        connection.putrequest(method, target)
        for name, value in headers.items():
            connection.putheader(name, value)
        if stub.cookie:
            connection.putheader("Cookie", stub.cookie)
        connection.endheaders()
        yield connection
    finally:
        connection.close()
