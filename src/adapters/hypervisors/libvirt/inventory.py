"""Inventory on libvirt: Describe, the VM info Reconfigure decides from, and ListVMs.

Describe and ListVMs read through the domain cache (domain_cache.py), kept current by
libvirt's events and by this replica's own writes; a listing makes bulk calls only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import libvirt
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import best_effort
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.device_models import (
    shown_disk_controller,
    shown_nic_model,
)
from pyrigaud.adapters.hypervisors.libvirt.domain_cache import (
    RUNNING_STATES,
    DomainCache,
    DomainView,
    listed_view,
    read_view,
)
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DomainFacts, awaiting_power_cycle
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest, power_of
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    GIB,
    VolumeFacts,
    volume_facts,
    volumes_by_path,
)
from pyrigaud.domain.addresses import nic_addresses
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskInfo, NetworkInfo, VMDescription, VMInfo
from pyrigaud.domain.remembered import Remembered

VirDomain = Any

STATE_NAMES = {
    libvirt.VIR_DOMAIN_NOSTATE: "no state",
    libvirt.VIR_DOMAIN_RUNNING: "running",
    libvirt.VIR_DOMAIN_BLOCKED: "blocked",
    libvirt.VIR_DOMAIN_PAUSED: "paused",
    libvirt.VIR_DOMAIN_SHUTDOWN: "shutting down",
    libvirt.VIR_DOMAIN_SHUTOFF: "shut off",
    libvirt.VIR_DOMAIN_CRASHED: "crashed",
    libvirt.VIR_DOMAIN_PMSUSPENDED: "suspended",
}
ADDRESS_SOURCES = (
    libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
    libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
)
# Raw keys that VMInfo's own fields already carry: left out of its provider_raw, so that a
# ListVMs of 10,000 VMs fits the manager's 4 MiB message limit.
IN_VMINFO = frozenset({"id", "name", "cpu", "memory_mib"})


def guest_addresses(dom: VirDomain) -> tuple[str, ...]:
    """Guest addresses from DHCP leases, else the guest agent; none when neither answers."""
    for source in ADDRESS_SOURCES:
        interfaces = best_effort(partial(dom.interfaceAddresses, source, 0))
        if not interfaces:
            continue  # no lease / no agent: try the next source
        found = [
            str(address["addr"])
            for interface in interfaces.values()
            for address in interface.get("addrs") or ()
        ]
        if found:
            return tuple(found)
    return ()


class LibvirtInventory:
    """The domain cache's warm-up is this inventory's listing (`warm_up`)."""

    def __init__(self, host: LibvirtHost) -> None:
        self._host = host
        self._domains: DomainCache = host.domains
        # One listing at a time (the cache's warm-up is one): a second would redo the same reads.
        self._listing = threading.Lock()
        # A cache hit's description, derived again only when the view or the addresses change.
        self._described = Remembered(_hit_description)

    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        """A cache hit is answered from the cache alone: no connection, no call slot, no
        libvirt call, none counted. Otherwise read through the connection, kept and counted
        as one round trip."""
        hit = self._domains.hit(vm_id)
        if hit is not None:
            return Success(self._described(vm_id, hit))

        def describe(conn: VirConnect) -> VMDescription | None:
            self._domains.attach(conn)
            view, dom = self._domains.view(vm_id), None
            if view is None or view.live is None:
                self._host.count_round_trip()
                guest = Guest.lookup(conn, vm_id)
                if guest is None:
                    return None
                dom = guest.dom
                with self._domains.loading() as load:
                    view = read_view(dom)
                    load.keep_view(guest.id, view)
            return _description(view, self._last_addresses(conn, view, dom))

        return self._host.read_through_cache(
            f"describe {vm_id!r}", lambda conn: Success(describe(conn))
        )

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        """Read from libvirt, never the cache: Reconfigure decides from it what to change."""

        def info(conn: VirConnect) -> VMInfo | None:
            self._domains.attach(conn)
            guest = Guest.lookup(conn, vm_id)
            if guest is None:
                return None
            with self._domains.loading() as load:
                view = read_view(guest.dom, with_live=False)
                load.keep_view(guest.id, view)
            ips = (self._domains.addresses(view.facts.uuid) or ()) if view.running else ()
            return _info(
                view.facts.uuid, view.facts, view.state, ips, lambda path: volume_facts(conn, path)
            )

        return self._host.run(f"read VM {vm_id!r}", lambda conn: Success(info(conn)))

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        """Bulk calls for the domains, their states and the volumes; per domain at most its XML.

        On a remote libvirtd every per-domain call is a socket round trip, so states come
        from one stats call and disk sizes from one volume listing per pool; definitions come
        from the cache, read only for domains it does not hold. Addresses are the last known.
        """
        return self._host.run("list VMs", lambda conn: Success(self._list(conn)))

    def warm_up(self, conn: VirConnect) -> None:
        """The cache's own listing, not needed once another one has run."""
        self._list(conn, warm_up_only=True)

    def _list(self, conn: VirConnect, *, warm_up_only: bool = False) -> list[VMInfo]:
        self._domains.attach(conn)
        with self._listing:
            if not self._domains.claim_warm_up(conn) and warm_up_only:
                return []
            return self._list_locked(conn)

    def _list_locked(self, conn: VirConnect) -> list[VMInfo]:
        with self._domains.loading() as load:
            domains = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_PERSISTENT)
            states = (
                conn.domainListGetStats(domains, libvirt.VIR_DOMAIN_STATS_STATE) if domains else []
            )
            volumes = volumes_by_path(conn) if domains else {}
            listed = []
            for dom, stats in states:
                vm_id = str(dom.UUIDString())
                state = int(stats["state.state"])
                view = self._domains.view(vm_id)
                if view is None:
                    view = listed_view(state, Guest(dom).facts())
                    load.keep_view(vm_id, view)
                running = state in RUNNING_STATES
                ips = (self._domains.addresses(vm_id) or ()) if running else ()
                listed.append(_info(vm_id, view.facts, state, ips, volumes.get))
            load.keep_addresses_of({info.id for info in listed})
        # Answers are built afresh, not kept: at 10,000 domains kept answers held ~18 MiB
        # to save ~0.4 s per listing.
        return listed

    def _last_addresses(
        self, conn: VirConnect, view: DomainView, dom: VirDomain | None
    ) -> tuple[str, ...]:
        """The guest's last known addresses; read now only if never read since it started (a
        round trip, counted unless the domain `dom` was just read)."""
        if not view.running:
            return ()
        known = self._domains.addresses(view.facts.uuid)
        if known is not None:
            return known
        if dom is None:
            self._host.count_round_trip()
            guest = Guest.lookup(conn, view.facts.uuid)
            dom = guest.dom if guest is not None else None
        return self._domains.read_addresses(view.facts.uuid, dom) if dom is not None else ()


def _hit_description(hit: tuple[DomainView, tuple[str, ...]]) -> VMDescription:
    return _description(*hit)


def _description(view: DomainView, ips: tuple[str, ...]) -> VMDescription:
    live = view.live or view.facts
    return VMDescription(
        power_state=power_of(view.state),
        ips=ips,
        console_url=f"vnc://127.0.0.1:{live.vnc_port}" if live.vnc_port else "",
        raw=_raw(view.facts.uuid, live, view.state, persistent=view.facts),
    )


def _info(
    vm_id: str,
    facts: DomainFacts,
    state: int,
    ips: tuple[str, ...],
    volume_of: Callable[[str], VolumeFacts | None],
) -> VMInfo:
    shown = nic_addresses(ips, len(facts.nics))
    disks = []
    for disk in facts.disks:
        volume = volume_of(disk.path)
        disks.append(
            DiskInfo(
                id=disk.target,
                path=disk.path,
                size_gib=-(-volume.capacity_bytes // GIB) if volume else 0,
                format=volume.format if volume else disk.format,
            )
        )
    return VMInfo(
        id=vm_id,
        name=facts.name,
        power_state=power_of(state),
        ips=ips,
        cpu=facts.vcpus,
        memory_mib=facts.memory_mib,
        disks=tuple(disks),
        networks=tuple(
            NetworkInfo(name=nic.source or nic.kind, mac=nic.mac, ip_address=address)
            for nic, address in zip(facts.nics, shown, strict=True)
        ),
        provider_raw={
            key: value for key, value in _raw(vm_id, facts, state).items() if key not in IN_VMINFO
        },
    )


def _raw(
    vm_id: str, facts: DomainFacts, state: int, *, persistent: DomainFacts | None = None
) -> dict[str, str]:
    """`persistent` (with the live `facts`) is Describe's: it adds what waits for a power
    cycle (read from libvirt both times, so every replica says the same) and the device models
    in use (the root disk's controller and each NIC's, in the domain's words where it has
    them), which ListVMs leaves out to stay within the manager's message limit."""
    owner = facts.metadata.owner if facts.metadata and facts.metadata.owner else None
    described = {}
    if persistent is not None:
        described["pendingPowerCycle"] = ",".join(awaiting_power_cycle(facts, persistent))
        described["disk_controller"] = shown_disk_controller(facts.disks[0]) if facts.disks else ""
        described["nic_models"] = ",".join(shown_nic_model(nic.model) for nic in facts.nics)
    return {
        "id": vm_id,
        "name": facts.name,
        "state": STATE_NAMES.get(state, "unknown"),
        "cpu": str(facts.vcpus),
        "max_cpu": str(facts.max_vcpus),
        "memory_mib": str(facts.memory_mib),
        "firmware": facts.firmware,
        "owner": owner.provider if owner else "",
        **described,
    }
