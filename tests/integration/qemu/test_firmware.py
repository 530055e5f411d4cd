"""Firmware on the real daemon: what getDomainCapabilities offers is honoured, the rest refused.

CI installs OVMF and swtpm (scripts/libvirtd.sh), so UEFI and secure boot must work there.
Secure boot needs a machine with SMM: such a domain gets q35 (others the host's default
machine), so whether it is honoured or refused by name follows what the capabilities say
for q35.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import libvirt

from pyrigaud.adapters.hypervisors.libvirt.domain_xml import HOTPLUG_ROOT_PORTS
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CreateRequest,
    DiskSpec,
    Firmware,
    OwnerMark,
    SecurityProfile,
    VMChanges,
    VMClass,
)

from support import error_of, ok
from support.libvirt import create_vm
from support.qemu import QemuHost, ensure_test_pool

OWNER = OwnerMark(provider="tests/firmware")
HOT_PLUGGED_DISKS = 4


def offered(conn: Any, path: str, machine: str | None = None) -> set[str]:
    caps = ET.fromstring(conn.getDomainCapabilities(None, None, machine, "qemu", 0))
    return {value.text or "" for value in caps.findall(f"{path}/value")}


def uefi_class(**security: bool) -> VMClass:
    return VMClass(
        cpu=1, memory_mib=256, firmware=Firmware.UEFI, security=SecurityProfile(**security)
    )


def test_uefi_is_offered_and_honoured(qemu: QemuHost, conn: Any) -> None:
    assert "efi" in offered(conn, "os/enum[@name='firmware']"), "install ovmf on the host"
    vm_id = ok(
        create_vm(qemu.backend, CreateRequest(name="uefi-guest", vm_class=uefi_class()), OWNER)
    )
    root = ET.fromstring(conn.lookupByUUIDString(vm_id).XMLDesc(0))
    assert root.find("os").get("firmware") == "efi"  # type: ignore[union-attr]
    ok(qemu.backend.lifecycle.delete(vm_id))


def test_secure_boot_follows_the_host(qemu: QemuHost, conn: Any) -> None:
    request = CreateRequest(name="secure-guest", vm_class=uefi_class(secure_boot=True))
    result = create_vm(qemu.backend, request, OWNER)
    if "yes" in offered(conn, "os/loader/enum[@name='secure']", "q35"):
        ok(qemu.backend.lifecycle.delete(ok(result)))
    else:
        error = error_of(result)
        assert error.kind is ErrorKind.FAILED_PRECONDITION
        assert fields.CLASS_SECURE_BOOT in error.message
        assert ok(qemu.backend.lifecycle.find_by_name("secure-guest")) is None


def test_a_secure_boot_guest_starts_on_q35_with_a_secure_loader(qemu: QemuHost, conn: Any) -> None:
    assert "yes" in offered(conn, "os/loader/enum[@name='secure']", "q35"), "install ovmf"
    request = CreateRequest(
        name="secure-running", image=qemu.image, vm_class=uefi_class(secure_boot=True)
    )
    vm_id = ok(create_vm(qemu.backend, request, OWNER))
    ok(qemu.backend.power.power_on(vm_id))
    dom = conn.lookupByUUIDString(vm_id)
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    root = ET.fromstring(dom.XMLDesc(0))
    assert "q35" in root.find("os/type").get("machine", "")  # type: ignore[union-attr]
    loader = root.find("os/loader")
    assert loader is not None
    assert loader.get("secure") == "yes"
    assert root.find("features/smm").get("state") == "on"  # type: ignore[union-attr]
    ok(qemu.backend.lifecycle.delete(vm_id))


def test_a_running_q35_guest_takes_a_hot_plugged_disk(qemu: QemuHost, conn: Any) -> None:
    """q35 is PCI Express: a hot-plugged device needs a free root port, which the domain keeps."""
    request = CreateRequest(
        name="secure-hotplug", image=qemu.image, vm_class=uefi_class(secure_boot=True)
    )
    vm_id = ok(create_vm(qemu.backend, request, OWNER))
    ok(qemu.backend.power.power_on(vm_id))
    extra = tuple(DiskSpec(size_gib=1) for _ in range(HOT_PLUGGED_DISKS))
    ok(qemu.backend.lifecycle.reconfigure(vm_id, VMChanges(disks=extra)))
    live = ET.fromstring(conn.lookupByUUIDString(vm_id).XMLDesc(0))
    targets = [disk.get("dev") for disk in live.iterfind("devices/disk/target")]
    assert targets == ["vda", "vdb", "vdc", "vdd", "vde"]
    volumes = {str(volume.name()) for volume in ensure_test_pool(conn).listAllVolumes(0)}
    beyond = tuple(DiskSpec(size_gib=1) for _ in range(HOT_PLUGGED_DISKS + HOTPLUG_ROOT_PORTS))
    refused = error_of(qemu.backend.lifecycle.reconfigure(vm_id, VMChanges(disks=beyond)))
    assert refused.kind is ErrorKind.FAILED_PRECONDITION  # the ports ran out: power off first
    assert "power it off to add the disk" in refused.message
    after = {str(volume.name()) for volume in ensure_test_pool(conn).listAllVolumes(0)}
    assert len(after) == len(volumes) + HOTPLUG_ROOT_PORTS - HOT_PLUGGED_DISKS  # no stray
    ok(qemu.backend.lifecycle.delete(vm_id))


def test_a_vtpm_follows_the_host(qemu: QemuHost, conn: Any) -> None:
    request = CreateRequest(name="tpm-guest", vm_class=uefi_class(tpm_enabled=True))
    result = create_vm(qemu.backend, request, OWNER)
    if "emulator" in offered(conn, "devices/tpm/enum[@name='backendModel']"):
        root = ET.fromstring(conn.lookupByUUIDString(ok(result)).XMLDesc(0))
        assert root.find("devices/tpm/backend").get("type") == "emulator"  # type: ignore[union-attr]
        ok(qemu.backend.lifecycle.delete(ok(result)))
    else:
        error = error_of(result)
        assert error.kind is ErrorKind.FAILED_PRECONDITION
        assert fields.CLASS_TPM_ENABLED in error.message
