"""What only a real libvirtd + QEMU shows about the libvirt backend (blank disks, no guest OS)."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import Any

import libvirt

from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    DiskQuery,
    DiskSpec,
    OwnerMark,
    SnapshotRequest,
    VMChanges,
)
from pyrigaud.domain.power import PowerState

from support import error_kind, ok
from support.libvirt import clone_vm, create_vm
from support.qemu import TEST_POOL_PATH, QemuHost, qemu_img_info

OWNER = OwnerMark(provider="tests/qemu")
GIB = 1024**3


def create(qemu: QemuHost, name: str, **changes: object) -> str:
    return ok(create_vm(qemu.backend, qemu.request(name, image=qemu.image, **changes), OWNER))


def live_xml(conn: Any, vm_id: str) -> ET.Element:
    return ET.fromstring(conn.lookupByUUIDString(vm_id).XMLDesc(0))


def pool_files() -> set[str]:
    return set(os.listdir(TEST_POOL_PATH))


def test_a_vm_runs_under_tcg_with_acpi_user_networking_and_an_agent_port(
    qemu: QemuHost, conn: Any
) -> None:
    vm_id = create(qemu, "qemu-xml")
    ok(qemu.backend.power.power_on(vm_id))
    assert conn.lookupByUUIDString(vm_id).state()[0] == libvirt.VIR_DOMAIN_RUNNING
    root = live_xml(conn, vm_id)
    assert root.get("type") == "qemu"
    assert root.find("features/acpi") is not None  # graceful shutdown and PCI hot-plug need it
    assert [nic.get("type") for nic in root.iterfind("devices/interface")] == ["user"]
    agent = root.find("devices/channel/target[@name='org.qemu.guest_agent.0']")
    assert agent is not None
    listen = root.find("devices/graphics[@type='vnc']/listen")
    assert listen is not None
    assert listen.get("address") == "127.0.0.1"
    assert conn.listAllNetworks(0) == []  # scripts/libvirtd.sh leaves no NAT network


def test_disks_of_a_running_vm_grow_and_new_ones_are_hot_plugged(qemu: QemuHost, conn: Any) -> None:
    vm_id = create(qemu, "qemu-grow", disks=(DiskSpec(size_gib=1),))
    ok(qemu.backend.power.power_on(vm_id))
    ok(
        qemu.backend.lifecycle.reconfigure(
            vm_id, VMChanges(root_disk_gib=3, disks=(DiskSpec(size_gib=2), DiskSpec(size_gib=1)))
        )
    )
    info = ok(qemu.backend.inventory.vm_info(vm_id))
    assert info is not None
    assert [disk.size_gib for disk in info.disks] == [3, 2, 1]
    # The guest sees the new sizes now (block resize, hot-plug), not only after a reboot.
    dom = conn.lookupByUUIDString(vm_id)
    live_targets = [t.get("dev") for t in live_xml(conn, vm_id).iterfind("devices/disk/target")]
    assert live_targets[:3] == ["vda", "vdb", "vdc"]
    assert dom.blockInfo("vda")[0] == 3 * GIB


def test_every_qcow2_disk_a_vm_gets_is_version_3(qemu: QemuHost, conn: Any) -> None:
    """Version 2 (libvirt's default) has no zero clusters: a guest's zeroing would allocate."""
    vm_id = create(qemu, "qemu-v3", disks=(DiskSpec(size_gib=1),))
    ok(qemu.backend.lifecycle.reconfigure(vm_id, VMChanges(disks=(DiskSpec(size_gib=1),) * 2)))
    sources = [
        source.get("file", "")
        for source in live_xml(conn, vm_id).iterfind("devices/disk[@device='disk']/source")
    ]
    assert len(sources) == 3
    for path in sources:
        info = qemu_img_info(path)
        assert (info["format"], info["format-specific"]["data"]["compat"]) == ("qcow2", "1.1")


def test_snapshots_of_a_running_vm_are_internal_with_memory_and_revert_to_running(
    qemu: QemuHost,
) -> None:
    vm_id = create(qemu, "qemu-snap")
    ok(qemu.backend.power.power_on(vm_id))
    files_before = pool_files()
    asked = ok(qemu.backend.snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="live")))
    # Asked without memory it still holds memory, and says so: a disk-only snapshot of a running
    # VM would be an external overlay file that libvirt 9 cannot revert to.
    assert asked.include_memory
    assert pool_files() == files_before
    ok(qemu.backend.power.power_off(vm_id))
    ok(qemu.backend.snapshots.revert_snapshot(vm_id, "live"))
    assert ok(qemu.backend.power.power_state(vm_id)) is PowerState.ON
    details = ok(qemu.backend.disk_transfer.disk_details(DiskQuery(vm_id=vm_id)))
    assert details.snapshots == ("live",)
    ok(qemu.backend.snapshots.delete_snapshot(vm_id, "live"))
    assert ok(qemu.backend.disk_transfer.disk_details(DiskQuery(vm_id=vm_id))).snapshots == ()


def test_a_running_source_is_fully_cloned_from_one_point_and_never_linked(
    qemu: QemuHost,
) -> None:
    source = create(qemu, "qemu-src", disks=(DiskSpec(size_gib=1),))
    ok(qemu.backend.power.power_on(source))
    files_before = pool_files()
    linked = clone_vm(
        qemu.backend, CloneRequest(source_vm_id=source, target_name="qemu-lnk", linked=True), OWNER
    )
    assert error_kind(linked) is ErrorKind.FAILED_PRECONDITION
    assert pool_files() == files_before
    target = ok(
        clone_vm(qemu.backend, CloneRequest(source_vm_id=source, target_name="qemu-full"), OWNER)
    )
    assert ok(qemu.backend.power.power_state(source)) is PowerState.ON
    source_info = ok(qemu.backend.inventory.vm_info(source))
    target_info = ok(qemu.backend.inventory.vm_info(target))
    assert source_info is not None
    assert target_info is not None
    assert [d.size_gib for d in target_info.disks] == [d.size_gib for d in source_info.disks]
    assert not {d.path for d in target_info.disks} & {d.path for d in source_info.disks}
    assert ok(qemu.backend.disk_transfer.disk_details(DiskQuery(vm_id=target))).backing_file == ""
    ok(qemu.backend.power.power_on(target))  # the copy is a whole, usable disk set
    assert ok(qemu.backend.power.power_state(target)) is PowerState.ON


def test_delete_of_a_running_vm_with_a_snapshot_leaves_only_the_base_image(
    qemu: QemuHost,
) -> None:
    files_before = pool_files()
    vm_id = create(qemu, "qemu-gone", disks=(DiskSpec(size_gib=1),))
    ok(qemu.backend.power.power_on(vm_id))
    ok(
        qemu.backend.snapshots.create_snapshot(
            SnapshotRequest(vm_id=vm_id, name="s", include_memory=True)
        )
    )
    assert len(pool_files() - files_before) == 2
    ok(qemu.backend.lifecycle.delete(vm_id))
    assert pool_files() == files_before
    assert ok(qemu.backend.lifecycle.find_by_name("qemu-gone")) is None
