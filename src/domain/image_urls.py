"""Which image URLs a provider may fetch: a URL from a spec must not reach the host's secrets.

A download runs with the provider's network position, so a spec could aim it at the cloud
metadata service (credentials) or at services listening on loopback. Link-local and metadata
addresses are refused always, loopback unless the operator allows it; private ranges are allowed
because on-premises image mirrors live there. Callers check every address a name resolves to.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

ALLOWED_SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}
METADATA_HOST_NAMES = frozenset({"metadata.google.internal"})
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)


class UnsafeImageURLError(ValueError):
    """The URL may not be fetched; the message says why, for the spec's author."""


@dataclass(frozen=True)
class ImageURL:
    scheme: str
    host: str  # a name or an IP literal, without IPv6 brackets
    port: int
    target: str  # path and query, as sent in the request line


def parse_image_url(url: str) -> ImageURL:
    """Split an http(s) URL, refusing other schemes, credentials and metadata host names."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise UnsafeImageURLError(f"{url!r} is not a valid URL: {error}") from error
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise UnsafeImageURLError(f"only http and https URLs are fetched, not {parts.scheme!r}")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UnsafeImageURLError(f"{url!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeImageURLError("credentials in an image URL are not accepted")
    if host in METADATA_HOST_NAMES:
        raise UnsafeImageURLError(f"{host!r} is a cloud metadata service")
    if _is_ip_literal(host):
        address_problem_or_raise(host, allow_loopback=True)  # loopback is judged after resolving
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return ImageURL(scheme=scheme, host=host, port=port or DEFAULT_PORTS[scheme], target=target)


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


def address_problem_or_raise(address: str, *, allow_loopback: bool) -> None:
    problem = address_problem(address, allow_loopback=allow_loopback)
    if problem is not None:
        raise UnsafeImageURLError(problem)


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True
