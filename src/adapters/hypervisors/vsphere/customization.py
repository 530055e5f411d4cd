"""Fixed IPs, DNS, host name and time zone as a vSphere guest customization (Linux guests).

vCenter applies a customization at the guest's next boot; it travels in the clone spec, sized
to the NICs the clone will have: one adapter setting per NIC, DHCP where no static IP is asked.
cloud-init data travels separately, as guestinfo keys (class_spec.guestinfo).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.iterables import Fold
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.networks import AttachmentFields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import NetworkAttachment

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

# LinuxPrep's domain is mandatory; this is what Linux itself calls "no domain".
DEFAULT_DOMAIN = "localdomain"


@dataclass(frozen=True)
class GuestCustomization:
    """What to customize, checked before anything is made; `spec` sizes it to the VM's NICs."""

    adapters: tuple[Any, ...]  # one vim IPSettings per network attachment, in order
    identity: Any
    dns_servers: tuple[str, ...]
    domain: str

    def spec(self, nic_count: int) -> Any:
        dhcp = [_dhcp() for _ in range(max(nic_count - len(self.adapters), 0))]
        return vim.vm.customization.Specification(
            identity=self.identity,
            globalIPSettings=vim.vm.customization.GlobalIPSettings(
                dnsServerList=list(self.dns_servers) or None,
                dnsSuffixList=[self.domain] if self.domain else None,
            ),
            nicSettingMap=[
                vim.vm.customization.AdapterMapping(adapter=adapter)
                for adapter in [*self.adapters[:nic_count], *dhcp]
            ],
        )


def guest_customization(
    networks: Sequence[NetworkAttachment],
    *,
    host_name: str,
    domain: str,
    time_zone: str,
    named: AttachmentFields,
) -> Result[GuestCustomization | None, ProviderError]:
    """None when nothing needs a customization (no static IP, no time zone).

    `named` names the request's fields in error messages (Create's or Clone's networks).
    """
    if not time_zone and not any(network.static_ip for network in networks):
        return Success(None)
    adapters: Result[tuple[Any, ...], ProviderError] = Fold.collect(
        (_adapter(network, index, named) for index, network in enumerate(networks)), Success(())
    )
    identity = vim.vm.customization.LinuxPrep(
        hostName=(
            vim.vm.customization.FixedName(name=host_name)
            if host_name
            else vim.vm.customization.VirtualMachineNameGenerator()
        ),
        domain=domain or DEFAULT_DOMAIN,
        timeZone=time_zone or None,
        hwClockUTC=True,
    )
    dns = tuple(dict.fromkeys(server for network in networks for server in network.dns))

    def customization(settings: tuple[Any, ...]) -> GuestCustomization:
        return GuestCustomization(
            adapters=settings, identity=identity, dns_servers=dns, domain=domain
        )

    return adapters.map(customization)


def _adapter(
    network: NetworkAttachment, index: int, named: AttachmentFields
) -> Result[Any, ProviderError]:
    if not network.static_ip:
        return Success(_dhcp())
    address = network.static_ip
    if "/" not in address:
        if not network.prefix:
            return Failure(
                ProviderError.invalid_spec(
                    named.name(index, "prefix"), "a static IP needs its prefix length (e.g. 24)"
                )
            )
        address = f"{address}/{network.prefix}"
    try:
        interface = ipaddress.ip_interface(address)
    except ValueError:
        return Failure(
            ProviderError.invalid_spec(
                named.name(index, "static_ip"), f"{address!r} is not an IP/prefix"
            )
        )
    if interface.version != 4:
        return Failure(
            ProviderError.unsupported("IPv6 static addresses are not implemented for vSphere")
        )
    return Success(
        vim.vm.customization.IPSettings(
            ip=vim.vm.customization.FixedIp(ipAddress=str(interface.ip)),
            subnetMask=str(interface.netmask),
            gateway=[network.gateway] if network.gateway else None,
            dnsServerList=list(network.dns) or None,
        )
    )


def _dhcp() -> Any:
    return vim.vm.customization.IPSettings(ip=vim.vm.customization.DhcpIpGenerator())
