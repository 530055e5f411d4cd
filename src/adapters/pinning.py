"""Resolve once, check every address, pin one: the one rule by which a connection to a host
that a request named (an image download, a staging store) reaches only an address that was
checked.

The host is resolved once and every address it resolves to is checked (a name with one bad
address is refused whole); the connection then goes to one of them, so a DNS answer that
changes between the check and the connect cannot move it. The pin is IPv4 first: a pinned
connection cannot fall back to the next address as a resolver's caller would, and a host named
in both families listens on IPv4 more often than not.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError


def pinned_address(
    host: str,
    port: int,
    refusal: Callable[[str], ProviderError | None],
    unresolved: Callable[[str], ProviderError],
) -> Result[str, ProviderError]:
    """The address of `host` a connection is pinned to, once every address it resolves to
    passed `refusal` (None: allowed); the first refusal, or `unresolved` told what the name
    lookup found wrong."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        return Failure(unresolved(f"cannot resolve {host!r}: {error}"))
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not addresses:
        return Failure(unresolved(f"{host!r} resolves to no address"))
    for address in addresses:
        refused = refusal(address)
        if refused is not None:
            return Failure(refused)
    return Success(min(addresses, key=_is_ipv6))


def _is_ipv6(address: str) -> bool:
    return ":" in address
