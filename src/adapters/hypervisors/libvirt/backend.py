"""The libvirt backend's ports (TEMPORARY stand-in: one object serves them all until the split)."""

from __future__ import annotations

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.hypervisor import LibvirtHypervisor
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Clock


def build_libvirt_backend(
    connection: LibvirtConnection,
    clock: Clock,
    *,
    domain_type: str,
    pools: PoolSettings,
    allow_loopback_urls: bool,
    migration_storage_root: str,
) -> Backend:
    hypervisor = LibvirtHypervisor(
        connection,
        clock,
        domain_type=domain_type,
        pools=pools,
        allow_loopback_urls=allow_loopback_urls,
        migration_storage_root=migration_storage_root,
    )
    return Backend(
        lifecycle=hypervisor,
        power=hypervisor,
        inventory=hypervisor,
        health=hypervisor,
        capabilities=hypervisor,
        tasks=hypervisor,
        snapshots=hypervisor,
        cloning=hypervisor,
        images=hypervisor,
        disk_transfer=hypervisor,
    )
