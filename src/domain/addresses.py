"""Which guest addresses the manager is shown: no loopback, link-local or unspecified ones.

Decided here only: the adapters report what the guest reports, DescribeVM and ListVMs keep
what `routable_addresses` keeps, and a backend that knows its guest's addresses only as a
list gives them to its NICs by position with `nic_addresses`."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from functools import lru_cache


def routable_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    """Keep the addresses worth reporting, in order, without duplicates or unparsable text."""
    return _routable(addresses if type(addresses) is tuple else tuple(addresses))


def nic_addresses(addresses: Iterable[str], nics: int) -> tuple[str, ...]:
    """The address shown on each of `nics` NICs, in order: the guest's routable addresses by
    position, "" for a NIC past the last."""
    routable = routable_addresses(addresses)
    return tuple(routable[index] if index < len(routable) else "" for index in range(nics))


@lru_cache(maxsize=16384)
def _routable(addresses: tuple[str, ...]) -> tuple[str, ...]:
    """Cached whole, one entry per VM's set of addresses: Describe asks for every VM about
    every 10 s, and a guest's addresses rarely change."""
    kept: dict[str, None] = {}
    for text in addresses:
        address = _reportable(text)
        if address is not None:
            kept.setdefault(address, None)
    return tuple(kept)


def _reportable(text: str) -> str | None:
    """The canonical form of one address, or None."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0].split("/", 1)[0])
    except ValueError:
        return None
    if address.is_loopback or address.is_link_local or address.is_unspecified:
        return None
    return str(address)
