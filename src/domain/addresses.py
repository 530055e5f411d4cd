"""Which guest addresses the manager is shown: no loopback, link-local or unspecified ones."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def routable_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    """Keep the addresses worth reporting, in order, without duplicates or unparsable text."""
    kept: dict[str, None] = {}
    for text in addresses:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0].split("/", 1)[0])
        except ValueError:
            continue
        if not (address.is_loopback or address.is_link_local or address.is_unspecified):
            kept.setdefault(str(address), None)
    return tuple(kept)
