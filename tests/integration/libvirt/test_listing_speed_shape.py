"""ListVMs' call shape: bulk calls per listing, never per-domain state or volume lookups.

On a remote libvirtd each per-domain call is a socket round trip, so the shape is the speed;
counted through a thin wrapper over the real test-driver connection and its domains.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import libvirt

from pyrigaud.domain.models import CreateRequest, DiskSpec, OwnerMark, VMChanges, VMClass
from pyrigaud.domain.power import PowerState

from support import ManualClock, ok
from support.libvirt import create_vm, isolated_host_uri, make_backend

OWNER = OwnerMark(provider="tests/libvirt-listing")
DOMAINS = 6
FOREIGN_DISK = "/nowhere/foreign.img"  # a disk no pool knows: size 0, its XML's format


class CountingDomain(libvirt.virDomain):  # type: ignore[misc]
    """A real virDomain (libvirt's bulk calls check the type) that counts its method calls."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "_pyrigaud_calls")[f"domain.{name}"] += 1
        return super().__getattribute__(name)


class CountingConnection:
    """The real connection; domains it hands out count their calls into the same Counter."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        self.calls[name] += 1
        method = getattr(self._conn, name)
        if not callable(method):
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            return self._counting(method(*args, **kwargs))

        return counted

    def _counting(self, result: Any) -> Any:
        if isinstance(result, libvirt.virDomain):
            result.__class__ = CountingDomain
            result._pyrigaud_calls = self.calls
        elif isinstance(result, list):
            for item in result:
                self._counting(item)
        elif isinstance(result, tuple) and result:
            self._counting(result[0])
        return result


def counting_host(tmp_path: Path) -> tuple[Any, Any, CountingConnection]:
    opened: list[CountingConnection] = []

    def open_counting(uri: str) -> CountingConnection:
        opened.append(CountingConnection(libvirt.open(uri)))
        return opened[-1]

    backend, connection = make_backend(
        isolated_host_uri(tmp_path), ManualClock(), opener=open_counting
    )
    assert backend.health.check().ok  # opens the connection
    return backend, connection, opened[0]


def define_foreign_domain(connection: Any) -> None:
    ok(
        connection.call(
            lambda conn: conn.defineXML(
                "<domain type='test'><name>foreign</name><memory unit='MiB'>128</memory>"
                "<vcpu current='1'>2</vcpu><os><type>hvm</type></os><devices>"
                f"<disk type='file' device='disk'><driver name='qemu' type='vmdk'/>"
                f"<source file='{FOREIGN_DISK}'/><target dev='vda'/></disk>"
                "</devices></domain>"
            )
        )
    )


def test_list_vms_makes_bulk_calls_only(tmp_path: Path) -> None:
    backend, connection, counting = counting_host(tmp_path)
    ids = [
        ok(
            create_vm(
                backend,
                CreateRequest(
                    name=f"shape-{index}",
                    vm_class=VMClass(cpu=1, memory_mib=256),
                    disks=(DiskSpec(size_gib=3),),
                ),
                OWNER,
            )
        )
        for index in range(DOMAINS)
    ]
    for vm_id in ids[::2]:
        ok(backend.power.power_on(vm_id))
    define_foreign_domain(connection)
    counting.calls.clear()

    listed = ok(backend.inventory.list_vms())

    calls = counting.calls
    assert len(listed) == DOMAINS + 1
    assert calls["listAllDomains"] == 1
    assert calls["domainListGetStats"] == 1
    assert calls["listAllStoragePools"] == 1
    assert calls["domain.state"] == 0
    assert calls["storageVolLookupByPath"] == 0
    assert calls["lookupByUUIDString"] == calls["lookupByName"] == 0
    assert calls["domain.XMLDesc"] == DOMAINS + 1  # the one per-domain call: its definition
    by_name = {vm.name: vm for vm in listed}
    assert {by_name[f"shape-{index}"].power_state for index in range(0, DOMAINS, 2)} == {
        PowerState.ON
    }
    assert {by_name[f"shape-{index}"].power_state for index in range(1, DOMAINS, 2)} == {
        PowerState.OFF
    }


def test_list_vms_reports_what_reading_each_vm_reports(tmp_path: Path) -> None:
    """The bulk volume map and states give the same rows as the per-VM path (vm_info)."""
    backend, connection, _ = counting_host(tmp_path)
    vm_id = ok(
        create_vm(
            backend,
            CreateRequest(
                name="same-row",
                vm_class=VMClass(cpu=2, memory_mib=512),
                disks=(DiskSpec(size_gib=5),),
            ),
            OWNER,
        )
    )
    define_foreign_domain(connection)

    listed = {vm.id: vm for vm in ok(backend.inventory.list_vms())}

    assert set(listed) >= {vm_id}
    for listed_id, row in listed.items():
        single = ok(backend.inventory.vm_info(listed_id))
        assert single is not None
        assert row == single
    ours = listed[vm_id]
    assert [disk.size_gib for disk in ours.disks][1:] == [5]
    assert all(disk.format == "qcow2" for disk in ours.disks)
    foreign = next(vm for vm in listed.values() if vm.name == "foreign")
    assert [(disk.path, disk.size_gib, disk.format) for disk in foreign.disks] == [
        (FOREIGN_DISK, 0, "vmdk")
    ]
    assert (foreign.cpu, foreign.memory_mib, foreign.provider_raw["max_cpu"]) == (1, 128, "2")


def test_a_repeated_listing_sees_every_change(tmp_path: Path) -> None:
    """Parsed XML is remembered by its exact text: a changed domain is parsed afresh."""
    backend, _, _ = counting_host(tmp_path)
    kept = ok(
        create_vm(
            backend, CreateRequest(name="kept", vm_class=VMClass(cpu=1, memory_mib=256)), OWNER
        )
    )
    changed = ok(
        create_vm(
            backend, CreateRequest(name="changed", vm_class=VMClass(cpu=1, memory_mib=256)), OWNER
        )
    )
    first = {vm.id: vm for vm in ok(backend.inventory.list_vms())}

    ok(backend.lifecycle.reconfigure(changed, VMChanges(cpu=2, memory_mib=512)))
    ok(backend.power.power_on(kept))
    second = {vm.id: vm for vm in ok(backend.inventory.list_vms())}

    assert (first[changed].cpu, first[changed].memory_mib) == (1, 256)
    assert (second[changed].cpu, second[changed].memory_mib) == (2, 512)
    assert (first[kept].power_state, second[kept].power_state) == (PowerState.OFF, PowerState.ON)
    ok(backend.lifecycle.delete(changed))
    assert [vm.id for vm in ok(backend.inventory.list_vms())] == [kept]
