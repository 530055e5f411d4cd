"""The libvirt backend: each port from its own module, over one shared LibvirtHost."""

from __future__ import annotations

from collections.abc import Callable

from pyrigaud.adapters.hypervisors.libvirt.capabilities import LibvirtCapabilities
from pyrigaud.adapters.hypervisors.libvirt.cloning import LibvirtCloning
from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.device_models import FallbackCounts
from pyrigaud.adapters.hypervisors.libvirt.disk_transfer import LibvirtDiskTransfer
from pyrigaud.adapters.hypervisors.libvirt.domain_cache import DomainCache
from pyrigaud.adapters.hypervisors.libvirt.health import LibvirtHealth
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.image_sources import ImageDownloads
from pyrigaud.adapters.hypervisors.libvirt.images import LibvirtImages
from pyrigaud.adapters.hypervisors.libvirt.inventory import LibvirtInventory, guest_addresses
from pyrigaud.adapters.hypervisors.libvirt.power import LibvirtPowerControl
from pyrigaud.adapters.hypervisors.libvirt.provisioning import LibvirtVMLifecycle
from pyrigaud.adapters.hypervisors.libvirt.snapshots import LibvirtSnapshots
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    PoolSettings,
    VolumeWriter,
    upload_volume,
)
from pyrigaud.adapters.hypervisors.libvirt.tasks import LibvirtTasks
from pyrigaud.adapters.hypervisors.libvirt.virtual_hardware import LibvirtHardwareFacts
from pyrigaud.adapters.hypervisors.libvirt.volume_streams import TransferVolumes
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.image_judge import ImageJudge


def build_libvirt_backend(
    connection: LibvirtConnection,
    clock: Clock,
    *,
    domain_type: str,
    pools: PoolSettings,
    allow_loopback_urls: bool,
    image_judge: ImageJudge,
    transfer_owner: str,
    volume_writer: VolumeWriter = upload_volume,
    scratch_dir: str | None = None,
    hardware_fallbacks: FallbackCounts | None = None,
    on_resync: Callable[[], None] = lambda: None,
) -> Backend:
    """Every port on `connection`, thread-safe; the only state kept is a cache of what libvirt
    says (domain_cache.py), kept current by libvirt's events and by the ports' own writes.

    `image_judge` judges every image downloaded or read for
    Create and ImagePrepare before a byte is stored; `transfer_owner` marks the temporary volumes of
    transfers as this provider's, for the sweep; `volume_writer` puts bytes into a volume (a
    libvirt stream unless a test's driver cannot stream); `scratch_dir` is where a snapshot's
    export keeps its anonymous scratch files (None: the system's temporary directory);
    `hardware_fallbacks` counts the devices a migrated guest gets for want of an equivalent;
    `on_resync` is told each time the domain cache is read afresh because its connection's
    event feed broke.
    """
    inventory: LibvirtInventory
    # The cache fills itself by the inventory's listing, which reads through the cache: the
    # lambda finds the inventory made below.
    domains = DomainCache(
        guest_addresses,
        clock=clock,
        warm_up=lambda conn: inventory.warm_up(conn),  # noqa: PLW0108
        on_resync=on_resync,
    )
    connection.on_close(domains.detach)
    host = LibvirtHost(
        connection=connection,
        clock=clock,
        domains=domains,
        domain_type=domain_type,
        pools=pools,
        write_volume=volume_writer,
    )
    downloads = ImageDownloads(allow_loopback_urls, volume_writer, image_judge)
    inventory = LibvirtInventory(host)
    disk_transfer = LibvirtDiskTransfer(
        host,
        TransferVolumes(owner=transfer_owner, clock=clock),
        scratch_dir=scratch_dir,
    )
    return Backend(
        lifecycle=LibvirtVMLifecycle(host, downloads, hardware_fallbacks),
        power=LibvirtPowerControl(host),
        inventory=inventory,
        health=LibvirtHealth(host),
        capabilities=LibvirtCapabilities(host),
        tasks=LibvirtTasks(),
        snapshots=LibvirtSnapshots(host),
        cloning=LibvirtCloning(host),
        images=LibvirtImages(host, downloads),
        disk_transfer=disk_transfer,
        transfer_leftovers=disk_transfer,
        hardware=LibvirtHardwareFacts(host),
    )
