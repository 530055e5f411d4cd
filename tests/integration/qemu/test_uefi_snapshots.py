"""Snapshots of UEFI (pflash) VMs on real libvirtd + QEMU, running and powered off.

libvirt 9 refuses internal snapshots of a running VM with pflash firmware, so these are
external overlays that pyrigaud reverts and deletes itself, with the NVRAM
(overlay_snapshots.py). The disk is a random base the VM grows from; QEMU writes over it
through its monitor's qemu-io (the guest has no OS to write with), and the disk at each point
is what `qemu-img convert` reads of its file. The NVRAM is changed behind the VM's back (as a
guest's firmware would) to show a revert puts back the copy taken with the snapshot.
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import libvirt
import libvirt_qemu

from pyrigaud.adapters.hypervisors.libvirt.storage import upload_volume, volume_xml
from pyrigaud.application.ports import Snapshots
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    Firmware,
    OwnerMark,
    SnapshotRequest,
    VMClass,
    VMImage,
)

from contract.harness import STAGED_FOLDER, STAGING_PVC
from support import error_of, ok
from support.libvirt import clone_vm, create_vm
from support.qemu import TEST_POOL_PATH, QemuHost, ensure_test_pool
from support.transfer import disk_moves, export_disk

OWNER = OwnerMark(provider="tests/uefi-snapshots")
BASE_BYTES = 4 * 1024**2
UEFI = VMClass(cpu=1, memory_mib=256, firmware=Firmware.UEFI)


def snapshots_of(qemu: QemuHost) -> Snapshots:
    assert qemu.backend.snapshots is not None
    return qemu.backend.snapshots


def random_base(conn: Any, name: str) -> tuple[str, bytes]:
    """A raw volume of random bytes in the test pool, for a VM to grow from."""
    content = os.urandom(BASE_BYTES)
    xml = volume_xml(f"{name}.raw", BASE_BYTES, volume_format="raw")
    volume = ensure_test_pool(conn).createXML(xml, 0)
    upload_volume(conn, volume, [content])
    return str(volume.path()), content


def uefi_vm(qemu: QemuHost, conn: Any, name: str) -> tuple[str, bytes]:
    """A UEFI VM grown from a random base, with a cloud-init seed (a read-only drive the
    snapshots leave out)."""
    path, content = random_base(conn, f"{name}-base")
    image = VMImage(path=path, format="raw")
    request = CreateRequest(name=name, vm_class=UEFI, image=image, user_data=b"#cloud-config\n")
    return ok(create_vm(qemu.backend, request, OWNER)), content


def disk_path(dom: Any) -> str:
    source = ET.fromstring(dom.XMLDesc(0)).find("devices/disk/source")
    assert source is not None
    return source.get("file", "")


def disk_now(dom: Any, scratch: Path) -> bytes:
    """The root disk as qemu-img reads it (its backing chain included), even while QEMU runs."""
    raw = scratch / "now.raw"
    subprocess.run(
        ["qemu-img", "convert", "-U", "-O", "raw", disk_path(dom), str(raw)],
        check=True,
        capture_output=True,
    )
    return raw.read_bytes()


def write_running(dom: Any, pattern: int, offset: int) -> None:
    """64 KiB of `pattern` at `offset` of the running VM's root disk, written by QEMU."""
    alias = ET.fromstring(dom.XMLDesc(0)).find("devices/disk/alias")
    assert alias is not None
    device = f"/machine/peripheral/{alias.get('name')}/virtio-backend"
    for command in (f"write -P {pattern:#x} {offset} 64k", "flush"):
        libvirt_qemu.qemuMonitorCommand(
            dom,
            f'qemu-io -d {device} "{command}"',
            libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP,
        )


def write_stopped(dom: Any, pattern: int, offset: int) -> None:
    """64 KiB of `pattern` at `offset` of the powered-off VM's root disk, by qemu-io."""
    command = f"write -P {pattern:#x} {offset} 64k"
    subprocess.run(["qemu-io", "-c", command, disk_path(dom)], check=True, capture_output=True)


def nvram_file(dom: Any) -> Path:
    for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE):
        named = ET.fromstring(dom.XMLDesc(flags)).findtext("os/nvram", "")
        if named:
            return Path(named)
    return Path(f"/var/lib/libvirt/qemu/nvram/{dom.name()}_VARS.fd")


def exported(
    qemu: QemuHost, vm_id: str, snapshot_id: str, disk_format: str, scratch: Path
) -> bytes:
    """The VM's disk exported at the snapshot onto the PVC, read back as raw by qemu-img."""
    name = f"{snapshot_id}.{disk_format}"
    url = f"pvc://{STAGING_PVC}/{STAGED_FOLDER}/{name}"
    moves = disk_moves(qemu.backend, qemu.staging_root)
    ok(export_disk(moves, vm_id, url, disk_format=disk_format, snapshot_id=snapshot_id))
    staged = qemu.staging_root / STAGING_PVC / STAGED_FOLDER / name
    raw = scratch / f"{name}.raw"
    subprocess.run(
        ["qemu-img", "convert", "-f", disk_format, "-O", "raw", str(staged), str(raw)],
        check=True,
        capture_output=True,
    )
    return raw.read_bytes()


def nvram_copy(conn: Any) -> bytes:
    """The one NVRAM copy a snapshot keeps beside its overlay in the test pool."""
    (copy,) = [name for name in pool_names(conn) if name.endswith(".nvram")]
    return (TEST_POOL_PATH / copy).read_bytes()


def pool_names(conn: Any) -> set[str]:
    pool = ensure_test_pool(conn)
    pool.refresh(0)
    return {str(volume.name()) for volume in pool.listAllVolumes(0)}


def test_a_running_uefi_vm_is_snapshotted_exported_reverted_and_its_snapshots_deleted(
    qemu: QemuHost, conn: Any, tmp_path: Path
) -> None:
    snapshots = snapshots_of(qemu)
    vm_id, _ = uefi_vm(qemu, conn, "uefi-running")
    ok(qemu.backend.power.power_on(vm_id))
    dom = conn.lookupByUUIDString(vm_id)
    before_snapshots = pool_names(conn)
    write_running(dom, 0x11, 0)
    at_first = disk_now(dom, tmp_path)

    first = ok(
        snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="first", include_memory=True))
    )
    assert first.include_memory
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    write_running(dom, 0x22, 64 * 1024)
    at_second = disk_now(dom, tmp_path)
    assert at_second != at_first
    second = ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="second")))
    write_running(dom, 0x33, 128 * 1024)
    assert disk_now(dom, tmp_path) not in (at_first, at_second)

    assert exported(qemu, vm_id, first.id, "raw", tmp_path) == at_first
    assert exported(qemu, vm_id, first.id, "qcow2", tmp_path) == at_first
    assert exported(qemu, vm_id, second.id, "raw", tmp_path) == at_second
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING  # exports leave the VM running

    refused = error_of(snapshots.revert_snapshot(vm_id, first.id))
    assert refused.kind is ErrorKind.FAILED_PRECONDITION
    assert "newest" in refused.message

    ok(snapshots.delete_snapshot(vm_id, first.id))  # merged under the second, VM running
    assert not second.include_memory
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert exported(qemu, vm_id, second.id, "raw", tmp_path) == at_second

    ok(snapshots.revert_snapshot(vm_id, second.id))
    assert not dom.isActive()  # no memory to resume: off, as after a power loss
    assert disk_now(dom, tmp_path) == at_second
    nvram_at_second = nvram_copy(conn)  # taken with the snapshot, while the VM was paused
    assert nvram_file(dom).read_bytes() == nvram_at_second
    nvram_file(dom).write_bytes(b"\x5a" * len(nvram_at_second))  # what a guest might leave
    ok(snapshots.revert_snapshot(vm_id, second.id))
    assert nvram_file(dom).read_bytes() == nvram_at_second

    ok(snapshots.delete_snapshot(vm_id, second.id))  # a powered-off VM: merged, left off
    assert not dom.isActive()
    assert disk_now(dom, tmp_path) == at_second
    assert dom.listAllSnapshots(0) == []
    assert pool_names(conn) == before_snapshots  # no overlay or NVRAM copy left
    ok(qemu.backend.power.power_on(vm_id))  # the disk is whole: the VM starts on it
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    ok(qemu.backend.lifecycle.delete(vm_id))


def test_a_running_uefi_vm_reverted_to_a_memory_snapshot_runs_on_from_it(
    qemu: QemuHost, conn: Any, tmp_path: Path
) -> None:
    snapshots = snapshots_of(qemu)
    vm_id, _ = uefi_vm(qemu, conn, "uefi-memory")
    before_snapshots = pool_names(conn)
    ok(qemu.backend.power.power_on(vm_id))
    dom = conn.lookupByUUIDString(vm_id)
    request = SnapshotRequest(vm_id=vm_id, name="awake", include_memory=True)
    awake = ok(snapshots.create_snapshot(request))
    assert awake.include_memory
    at_snapshot = disk_now(dom, tmp_path)
    write_running(dom, 0x55, 0)
    assert exported(qemu, vm_id, awake.id, "raw", tmp_path) == at_snapshot

    ok(snapshots.revert_snapshot(vm_id, awake.id))
    assert dom.state() == [libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_RESTORED]
    assert disk_now(dom, tmp_path) == at_snapshot
    write_running(dom, 0x66, 0)  # QEMU writes on into the emptied overlay, not the image
    assert exported(qemu, vm_id, awake.id, "raw", tmp_path) == at_snapshot
    ok(snapshots.revert_snapshot(vm_id, awake.id))  # the memory file serves again
    assert disk_now(dom, tmp_path) == at_snapshot

    ok(snapshots.delete_snapshot(vm_id, awake.id))
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert pool_names(conn) == before_snapshots  # overlay, NVRAM copy and memory file gone
    ok(qemu.backend.lifecycle.delete(vm_id))


def test_a_powered_off_uefi_vm_is_snapshotted_and_reverted_and_deleted_with_its_snapshots(
    qemu: QemuHost, conn: Any, tmp_path: Path
) -> None:
    snapshots = snapshots_of(qemu)
    before = pool_names(conn)
    vm_id, content = uefi_vm(qemu, conn, "uefi-off")
    dom = conn.lookupByUUIDString(vm_id)
    assert not nvram_file(dom).exists()  # never run: no NVRAM yet

    taken = ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="cold")))
    assert ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="cold"))) == taken
    at_snapshot = disk_now(dom, tmp_path)
    assert at_snapshot[:BASE_BYTES] == content
    write_stopped(dom, 0x44, 0)
    assert disk_now(dom, tmp_path) != at_snapshot
    assert exported(qemu, vm_id, taken.id, "raw", tmp_path) == at_snapshot

    ok(qemu.backend.power.power_on(vm_id))  # the firmware makes its NVRAM
    assert nvram_file(dom).exists()
    ok(snapshots.revert_snapshot(vm_id, taken.id))
    assert not dom.isActive()
    assert disk_now(dom, tmp_path) == at_snapshot
    assert not nvram_file(dom).exists()  # as at the snapshot: the template's at next boot

    ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="kept")))
    ok(qemu.backend.lifecycle.delete(vm_id))  # snapshots, overlays and copies go with it
    assert pool_names(conn) == {*before, "uefi-off-base.raw"}  # only the image it grew from
    assert vm_id not in {str(found.UUIDString()) for found in conn.listAllDomains(0)}


def test_a_bios_vm_keeps_internal_snapshots(qemu: QemuHost, conn: Any) -> None:
    """Nothing changes for a VM without pflash: its snapshot is inside its qcow2 disk."""
    vm_id = ok(create_vm(qemu.backend, qemu.request("bios-snap", image=qemu.image), OWNER))
    ok(qemu.backend.power.power_on(vm_id))
    taken = ok(snapshots_of(qemu).create_snapshot(SnapshotRequest(vm_id=vm_id, name="inside")))
    assert taken.include_memory
    root = ET.fromstring(
        conn.lookupByUUIDString(vm_id).snapshotLookupByName("inside").getXMLDesc(0)
    )
    assert {disk.get("snapshot") for disk in root.iterfind("disks/disk")} <= {"internal", "no"}
    ok(qemu.backend.lifecycle.delete(vm_id))


def test_a_snapshot_a_linked_clone_grew_on_is_kept_until_the_clone_goes(
    qemu: QemuHost, conn: Any, tmp_path: Path
) -> None:
    """A linked clone of the powered-off VM grows on its newest overlay: emptying or merging
    that overlay would change what the clone reads, so revert and delete wait for the clone.
    A full clone is a copy of the whole chain, and stands alone."""
    snapshots = snapshots_of(qemu)
    vm_id, _ = uefi_vm(qemu, conn, "uefi-linked")
    taken = ok(snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="base")))
    dom = conn.lookupByUUIDString(vm_id)
    write_stopped(dom, 0x77, 0)
    full = CloneRequest(source_vm_id=vm_id, target_name="uefi-full-clone")
    full_id = ok(clone_vm(qemu.backend, full, OWNER))
    assert disk_now(conn.lookupByUUIDString(full_id), tmp_path) == disk_now(dom, tmp_path)
    ok(qemu.backend.lifecycle.delete(full_id))
    request = CloneRequest(source_vm_id=vm_id, target_name="uefi-linked-clone", linked=True)
    clone_id = ok(clone_vm(qemu.backend, request, OWNER))
    for refused in (
        snapshots.delete_snapshot(vm_id, taken.id),
        snapshots.revert_snapshot(vm_id, taken.id),
    ):
        error = error_of(refused)
        assert error.kind is ErrorKind.FAILED_PRECONDITION
        assert "linked clone" in error.message
    ok(qemu.backend.lifecycle.delete(clone_id))
    ok(snapshots.delete_snapshot(vm_id, taken.id))
    ok(qemu.backend.lifecycle.delete(vm_id))
