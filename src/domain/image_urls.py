"""Which image URLs a provider may fetch: a URL from a spec must not reach the host's secrets.

A download runs with the provider's network position, so a spec could aim it at the cloud
metadata service (credentials) or at services listening on loopback. Link-local and metadata
addresses are refused always, loopback unless the operator allows it; private ranges are allowed
because on-premises image mirrors live there. Callers check every address a name resolves to.
A refusal is an invalid spec of the request field that gave the URL, which the caller names.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError

ALLOWED_SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}
METADATA_HOST_NAMES = frozenset({"metadata.google.internal"})
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)


@dataclass(frozen=True)
class ImageURL:
    scheme: str
    host: str  # a name or an IP literal, without IPv6 brackets
    port: int
    target: str  # path and query, as sent in the request line


def parse_image_url(url: str, field: str) -> Result[ImageURL, ProviderError]:
    """Split an http(s) URL, refusing other schemes, credentials and metadata host names, as
    an invalid spec of `field`."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return _unsafe(field, f"{url!r} is not a valid URL: {error}")
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        return _unsafe(field, f"only http and https URLs are fetched, not {parts.scheme!r}")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return _unsafe(field, f"{url!r} names no host")
    if parts.username is not None or parts.password is not None:
        return _unsafe(field, "credentials in an image URL are not accepted")
    if host in METADATA_HOST_NAMES:
        return _unsafe(field, f"{host!r} is a cloud metadata service")
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    split = ImageURL(scheme=scheme, host=host, port=port or DEFAULT_PORTS[scheme], target=target)
    if not _is_ip_literal(host):
        return Success(split)
    # Loopback is judged after resolving, where the operator's setting applies.
    return Result.do(split for _ in address_allowed(host, allow_loopback=True, field=field))


def address_problem(
    address: str,
    *,
    allow_loopback: bool,
    loopback_setting: str = "PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK",
) -> str | None:
    """Why the provider must not connect to `address`, or None when it may (`loopback_setting`
    is what allows loopback, for the message)."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    if parsed in METADATA_ADDRESSES:
        return f"{parsed} is a cloud metadata address"
    if parsed.is_link_local:
        return f"{parsed} is a link-local address"
    if parsed.is_unspecified or parsed.is_multicast:
        return f"{parsed} is not a host address"
    if parsed.is_loopback and not allow_loopback:
        return f"{parsed} is a loopback address (allowed only with {loopback_setting})"
    return None


def address_allowed(
    address: str, *, allow_loopback: bool, field: str
) -> Result[None, ProviderError]:
    """`address_problem` as a Result: an invalid spec of `field` when there is one."""
    problem = address_problem(address, allow_loopback=allow_loopback)
    return Success(None) if problem is None else _unsafe(field, problem)


def _unsafe(field: str, problem: str) -> Result[NoReturn, ProviderError]:
    return Failure(ProviderError.invalid_spec(field, problem))


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True
