"""CPU and memory of a running VM on the real daemon: hot-added within the class's headroom
(memory as DIMMs), else kept for the next boot and shown as waiting, else refused by name.

No guest OS is needed: QEMU plugs a DIMM and a vCPU without the guest's help, so the
assertions are on libvirt's live and persistent XML.
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from typing import Any

import libvirt
import pytest
from returns.result import Result

from pyrigaud.application.use_cases.reconfigure_vm import ReconfigureVM
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import OwnerMark, PerformanceProfile, VMChanges, VMClass

from support import error_of, ok
from support.libvirt import create_vm
from support.qemu import QemuHost

OWNER = OwnerMark(provider="tests/memory-hotplug")
KIB_PER_MIB = 1024


def running_vm(qemu: QemuHost, name: str, *, hot_add: bool) -> str:
    performance = PerformanceProfile(cpu_hot_add=hot_add, memory_hot_add=hot_add)
    vm_class = VMClass(cpu=1, memory_mib=256, performance=performance)
    vm_id = ok(create_vm(qemu.backend, qemu.request(name, vm_class=vm_class), OWNER))
    ok(qemu.backend.power.power_on(vm_id))
    return vm_id


def reconfigure(qemu: QemuHost, vm_id: str, **changes: int) -> Result[object, ProviderError]:
    reconfigure_vm = ReconfigureVM(qemu.backend.lifecycle, qemu.backend.inventory)
    return reconfigure_vm(vm_id, VMChanges(**changes))


def xml_of(conn: Any, vm_id: str, *, persistent: bool = False) -> ET.Element:
    flags = libvirt.VIR_DOMAIN_XML_INACTIVE if persistent else 0
    return ET.fromstring(conn.lookupByUUIDString(vm_id).XMLDesc(flags))


def memory_kib(root: ET.Element) -> int:
    memory = root.find("memory")
    assert memory is not None
    assert memory.get("unit") == "KiB"
    return int(memory.text or 0)


def dimm_sizes_kib(root: ET.Element) -> list[int]:
    return [int(size.text or 0) for size in root.iterfind("devices/memory/target/size")]


def current_vcpus(root: ET.Element) -> int:
    vcpu = root.find("vcpu")
    assert vcpu is not None
    return int(vcpu.get("current", vcpu.text or 0))


def waiting(qemu: QemuHost, vm_id: str) -> str:
    description = ok(qemu.backend.inventory.describe(vm_id))
    assert description is not None
    return description.raw["pendingPowerCycle"]


def power_cycle(qemu: QemuHost, vm_id: str) -> None:
    ok(qemu.backend.power.power_off(vm_id))
    ok(qemu.backend.power.power_on(vm_id))


def test_memory_is_hot_added_as_a_dimm_and_the_next_boot_has_the_same_total(
    qemu: QemuHost, conn: Any
) -> None:
    vm_id = running_vm(qemu, "hotplug-dimm", hot_add=True)
    ok(reconfigure(qemu, vm_id, memory_mib=512, cpu=2))

    live = xml_of(conn, vm_id)
    assert dimm_sizes_kib(live) == [256 * KIB_PER_MIB]
    assert live.find("devices/memory").get("model") == "dimm"  # type: ignore[union-attr]
    assert memory_kib(live) == 512 * KIB_PER_MIB
    assert current_vcpus(live) == 2
    persistent = xml_of(conn, vm_id, persistent=True)
    assert memory_kib(persistent) == 512 * KIB_PER_MIB
    assert dimm_sizes_kib(persistent) == []  # the boot cell holds it: no DIMM counted twice
    assert current_vcpus(persistent) == 2
    assert waiting(qemu, vm_id) == ""
    description = ok(qemu.backend.inventory.describe(vm_id))
    assert description is not None
    assert (description.raw["memory_mib"], description.raw["cpu"]) == ("512", "2")

    ok(reconfigure(qemu, vm_id, memory_mib=768))
    assert dimm_sizes_kib(xml_of(conn, vm_id)) == [256 * KIB_PER_MIB] * 2
    assert memory_kib(xml_of(conn, vm_id, persistent=True)) == 768 * KIB_PER_MIB

    power_cycle(qemu, vm_id)
    rebooted = xml_of(conn, vm_id)
    assert memory_kib(rebooted) == 768 * KIB_PER_MIB
    assert dimm_sizes_kib(rebooted) == []
    assert current_vcpus(rebooted) == 2
    assert waiting(qemu, vm_id) == ""


def test_a_change_without_hot_add_waits_for_a_power_cycle_and_says_so(
    qemu: QemuHost, conn: Any, caplog: pytest.LogCaptureFixture
) -> None:
    vm_id = running_vm(qemu, "hotplug-waits", hot_add=False)
    assert waiting(qemu, vm_id) == ""
    with caplog.at_level(logging.INFO, logger="pyrigaud"):
        ok(reconfigure(qemu, vm_id, memory_mib=512))
    logged = [record.getMessage() for record in caplog.records]
    assert any(
        "hotplug-waits" in line and "memory hot-add disabled; power off to change memory" in line
        for line in logged
    ), logged
    assert waiting(qemu, vm_id) == "memory"
    ok(reconfigure(qemu, vm_id, cpu=2))
    assert waiting(qemu, vm_id) == "cpu,memory"
    assert waiting(qemu, vm_id) == "cpu,memory"  # the cached view says the same
    assert memory_kib(xml_of(conn, vm_id)) == 256 * KIB_PER_MIB
    assert memory_kib(xml_of(conn, vm_id, persistent=True)) == 512 * KIB_PER_MIB

    ok(qemu.backend.power.power_off(vm_id))
    assert waiting(qemu, vm_id) == ""
    ok(qemu.backend.power.power_on(vm_id))
    assert waiting(qemu, vm_id) == ""
    live = xml_of(conn, vm_id)
    assert (memory_kib(live), current_vcpus(live)) == (512 * KIB_PER_MIB, 2)


def test_a_change_possible_neither_live_nor_for_the_next_boot_is_refused_by_name(
    qemu: QemuHost, conn: Any
) -> None:
    vm_id = running_vm(qemu, "hotplug-refused", hot_add=False)
    error = error_of(reconfigure(qemu, vm_id, cpu=300))
    assert error.kind is ErrorKind.FAILED_PRECONDITION
    assert "CPU hot-add disabled; power off to change CPUs" in error.message
    assert current_vcpus(xml_of(conn, vm_id, persistent=True)) == 1
    assert waiting(qemu, vm_id) == ""
