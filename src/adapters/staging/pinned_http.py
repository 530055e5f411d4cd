"""An S3 client's requests sent to the address the storage gate checked, not to whatever the
endpoint's name resolves to when a connection opens.

boto3 resolves the endpoint itself on every new connection; botocore lets a `before-send`
handler answer a request instead, so this one sends it through a urllib3 pool that connects
to the checked address, with the endpoint's name in the Host header (which SigV4 signed) and,
over TLS, as the name the certificate is verified for. Errors come back as botocore's own, so
its retries and pyrigaud's error mapping see what they would see without the pin.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import urllib3
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
    SSLError,
)
from botocore.httpsession import get_cert_path
from urllib3.exceptions import (
    ConnectTimeoutError as URLLib3ConnectTimeoutError,
)
from urllib3.exceptions import (
    NewConnectionError,
    ProtocolError,
)
from urllib3.exceptions import (
    ReadTimeoutError as URLLib3ReadTimeoutError,
)
from urllib3.exceptions import (
    SSLError as URLLib3SSLError,
)

DEFAULT_PORTS = {"http": 80, "https": 443}


def pin_to_address(
    client: Any, endpoint: str, address: str, *, connect_seconds: float, read_seconds: float
) -> None:
    """Have every request of `client` (made for `endpoint`, path-style) go to `address`."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    timeout = urllib3.Timeout(connect=connect_seconds, read=read_seconds)
    pool: urllib3.HTTPConnectionPool
    if parts.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            address,
            port,
            timeout=timeout,
            maxsize=16,
            cert_reqs="CERT_REQUIRED",
            ca_certs=get_cert_path(True),
            server_hostname=host,
            assert_hostname=host,
        )
    else:
        pool = urllib3.HTTPConnectionPool(address, port, timeout=timeout, maxsize=16)

    def send(request: AWSPreparedRequest, **_: object) -> AWSResponse:
        target = urlsplit(request.url)
        if target.hostname != host:
            raise EndpointConnectionError(endpoint_url=request.url, error="not the checked host")
        path = target.path or "/"
        headers = {**dict(request.headers), "Host": target.netloc}
        try:
            raw = pool.urlopen(
                method=request.method,
                url=f"{path}?{target.query}" if target.query else path,
                body=request.body,  # type: ignore[arg-type] # bytes or a file, as botocore sends
                headers=headers,
                retries=urllib3.Retry(False),
                assert_same_host=False,
                preload_content=False,
                decode_content=False,
                enforce_content_length=False,
            )
        except URLLib3SSLError as error:
            raise SSLError(endpoint_url=request.url, error=error) from error
        except (NewConnectionError, socket.gaierror) as error:
            raise EndpointConnectionError(endpoint_url=request.url, error=error) from error
        except URLLib3ConnectTimeoutError as error:
            raise ConnectTimeoutError(endpoint_url=request.url, error=error) from error
        except URLLib3ReadTimeoutError as error:
            raise ReadTimeoutError(endpoint_url=request.url, error=error) from error
        except ProtocolError as error:
            raise ConnectionClosedError(
                error=error, request=request, endpoint_url=request.url
            ) from error
        response = AWSResponse(request.url, raw.status, raw.headers, raw)  # type: ignore[arg-type]
        if not request.stream_output:
            response.content  # noqa: B018 - read now, as botocore's own sender does
        return response

    client.meta.events.register("before-send.s3", send)
