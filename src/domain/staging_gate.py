"""Where a staging store's connections may go: the S3 endpoint and the NFS server come from the
request's storage options, so a caller could aim the provider's network position at the
cloud metadata service, at services on loopback or anywhere else.

The rule, for every address the endpoint resolves to: link-local (the metadata addresses
among them), multicast and unspecified addresses are always refused; loopback only with
PYRIGAUD_STAGING_ALLOW_LOOPBACK; with PYRIGAUD_STAGING_ALLOWED_HOSTS set, only addresses in
one of its networks. Private ranges are allowed otherwise: on-premises stores live there.
The manager has a gate of its own (`--migration-storage-allowed-hosts`); a provider does not
rely on its caller.
"""

from __future__ import annotations

import ipaddress

from pydantic import field_validator

from pyrigaud.domain.image_urls import address_problem
from pyrigaud.domain.values import Value

LOOPBACK_SETTING = "PYRIGAUD_STAGING_ALLOW_LOOPBACK"
ALLOWED_HOSTS_SETTING = "PYRIGAUD_STAGING_ALLOWED_HOSTS"


class StagingGate(Value):
    """`allowed_networks`: IP networks (an address alone is a /32 or /128); empty: any."""

    allow_loopback: bool = False
    allowed_networks: tuple[str, ...] = ()

    @field_validator("allowed_networks")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(
                    f"{ALLOWED_HOSTS_SETTING}: {network!r} is not an IP address or network"
                ) from None
        return value

    def refusal(self, address: str) -> str | None:
        """Why a staging connection must not go to `address`, or None when it may."""
        problem = address_problem(
            address, allow_loopback=self.allow_loopback, loopback_setting=LOOPBACK_SETTING
        )
        if problem is not None or not self.allowed_networks:
            return problem
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
            parsed = parsed.ipv4_mapped
        if any(
            parsed in ipaddress.ip_network(network, strict=False)
            for network in self.allowed_networks
        ):
            return None
        return f"{parsed} is not in {ALLOWED_HOSTS_SETTING}"
