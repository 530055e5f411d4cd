"""The cloud-init NoCloud seed: an ISO9660 image labelled `cidata`, built in memory.

Joliet and Rock Ridge keep the dashed names (`user-data`, `meta-data`, `network-config`,
`vendor-data`) that plain ISO9660 cannot spell. Generated documents are written as JSON, which
every YAML parser (cloud-init's included) reads, so no value from a spec can break out of its
quoting.
"""

from __future__ import annotations

import io
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pycdlib

from pyrigaud.domain.models import NetworkAttachment

VOLUME_ID = "cidata"
MINIMAL_USER_DATA = b"#cloud-config\n"
# (ISO9660 8.3 name, real name) of each file a seed may hold.
USER_DATA = ("/USERDATA.;1", "user-data")
META_DATA = ("/METADATA.;1", "meta-data")
NETWORK_CONFIG = ("/NETWORKC.;1", "network-config")
VENDOR_DATA = ("/VENDORDA.;1", "vendor-data")
# A tz database name (Europe/Berlin, Etc/GMT+5, UTC): what cloud-init's `timezone:` links to.


@dataclass(frozen=True)
class SeedInput:
    name: str
    instance_id: str
    user_data: bytes = b""
    meta_data: bytes = b""
    networks: tuple[NetworkAttachment, ...] = ()  # each with the MAC its NIC will have
    vendor_data: bytes = b""  # the provider's defaults; the user-data's own settings win


def needs_seed(user_data: bytes, meta_data: bytes, networks: Sequence[NetworkAttachment]) -> bool:
    """A seed only when there is something to say: cloud-init data or static addressing."""
    return bool(user_data or meta_data or any(map(has_static_config, networks)))


def has_static_config(attachment: NetworkAttachment) -> bool:
    return bool(attachment.static_ip or attachment.gateway or attachment.dns)


def build_seed(seed: SeedInput) -> bytes:
    """The ISO bytes: user-data, meta-data and, with static addressing, network-config v2."""
    files = [
        (USER_DATA, seed.user_data or MINIMAL_USER_DATA),
        (META_DATA, seed.meta_data or _generated_meta_data(seed)),
    ]
    if any(map(has_static_config, seed.networks)):
        files.append((NETWORK_CONFIG, network_config(seed.networks)))
    if seed.vendor_data:
        files.append((VENDOR_DATA, seed.vendor_data))
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=VOLUME_ID)
    for (iso_path, name), data in files:
        iso.add_fp(io.BytesIO(data), len(data), iso_path, rr_name=name, joliet_path=f"/{name}")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def time_zone_vendor_data(time_zone: str) -> bytes:
    """`timezone:` as vendor-data, which cloud-init merges under the user-data, so the user's
    own user-data (a script, MIME or cloud-config alike) is carried byte for byte and a
    `timezone:` of its own still wins. The payload parser has checked the zone name."""
    return b"#cloud-config\n" + (json.dumps({"timezone": time_zone}) + "\n").encode()


def _generated_meta_data(seed: SeedInput) -> bytes:
    document = {"instance-id": seed.instance_id, "local-hostname": seed.name}
    return (json.dumps(document, indent=2) + "\n").encode()


def network_config(networks: Sequence[NetworkAttachment]) -> bytes:
    """Netplan-style version 2: NICs matched by MAC, static where asked, DHCP otherwise."""
    ethernets: dict[str, object] = {}
    for index, attachment in enumerate(networks):
        entry: dict[str, object] = {"match": {"macaddress": attachment.mac_address.lower()}}
        if attachment.static_ip:
            entry["addresses"] = [_with_prefix(attachment.static_ip, attachment.prefix)]
        else:
            entry["dhcp4"] = True
        if attachment.gateway:
            entry["routes"] = [{"to": "default", "via": attachment.gateway}]
        if attachment.dns:
            entry["nameservers"] = {"addresses": list(attachment.dns)}
        ethernets[f"nic{index}"] = entry
    return (json.dumps({"version": 2, "ethernets": ethernets}, indent=2) + "\n").encode()


def _with_prefix(address: str, prefix: int) -> str:
    """`address/prefix`; without a prefix, /24 for IPv4 and /64 for IPv6 (the common subnets)."""
    if "/" in address:
        return address
    default = 24 if ipaddress.ip_address(address).version == 4 else 64
    return f"{address}/{prefix or default}"
