"""How Create and Clone make a VM that a crash cannot leave half-known.

A placeholder domain marked as building, recording every volume it is about to get, is
defined first; then the volumes are made; then the finished definition replaces it. A name
already in use fails with ALREADY_EXISTS: whether that VM is ours to return is the
application's OwnershipRule's call, made on what find_by_name reports.
"""

from __future__ import annotations

import secrets
from typing import Any

import libvirt
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import best_effort, caught
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DomainDefinition, render_domain
from pyrigaud.adapters.hypervisors.libvirt.errors import error_code
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    VolumeWriter,
    volume_xml,
    write_new_volume,
)
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import NetworkAttachment

QEMU_MAC_PREFIX = "52:54:00"


def begin_building(conn: VirConnect, building: DomainDefinition) -> Result[Guest, ProviderError]:
    """Define the placeholder of a VM being made; a racing replica's of that name refuses it."""

    def taken(_error: libvirt.libvirtError) -> ProviderError | None:
        if Guest.by_name(conn, building.name) is not None:
            return _name_taken(building.name)
        return None

    def defined() -> Result[Guest, ProviderError]:
        return Success(Guest(conn.defineXML(render_domain(building))))

    return caught(defined, taken)


def abandon_building(guest: Guest) -> None:
    """Undo `begin_building` after a failure (its volumes are the caller's to remove)."""
    best_effort(guest.undefine)


def _name_taken(name: str) -> ProviderError:
    return ProviderError.already_exists(f"a VM named {name!r} already exists")


def write_seed(
    conn: VirConnect, pool: Any, name: str, iso: bytes, write_volume: VolumeWriter
) -> Result[str, ProviderError]:
    """The cloud-init seed ISO as a new raw volume `name`."""
    xml = volume_xml(name, len(iso), volume_format="raw")

    def written() -> Result[str, ProviderError]:
        return Success(write_new_volume(conn, pool, xml, (iso,), write_volume))

    return caught(written, _cannot_upload)


def _cannot_upload(error: libvirt.libvirtError) -> ProviderError | None:
    if error_code(error) != libvirt.VIR_ERR_NO_SUPPORT:
        return None
    return ProviderError.unsupported(
        "this libvirt driver cannot upload volumes (virStorageVolUpload), so it "
        "cannot carry the cloud-init seed that user_data, meta_data or static "
        "addressing need"
    )


def with_macs(attachments: tuple[NetworkAttachment, ...]) -> tuple[NetworkAttachment, ...]:
    """Every NIC with a MAC (a random one under QEMU's prefix if none given), for network-config."""
    return tuple(
        attachment
        if attachment.mac_address
        else attachment.model_copy(update={"mac_address": random_mac()})
        for attachment in attachments
    )


def random_mac() -> str:
    return ":".join((QEMU_MAC_PREFIX, *(f"{byte:02x}" for byte in secrets.token_bytes(3))))
