"""The domain XML for memory hot-add and secure boot, and what Reconfigure writes back.

Rendered XML is defined on libvirt's test driver (which parses it as the daemon does) and
read back; the hot-add itself needs QEMU (tests/integration/qemu/test_memory_hotplug.py).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import libvirt

from pyrigaud.adapters.hypervisors.libvirt.domain_xml import (
    KIB_PER_MIB,
    MEMORY_HOTPLUG_SLOTS,
    DomainDefinition,
    awaiting_power_cycle,
    dimm_xml,
    parse_domain,
    render_domain,
    with_resources,
)
from pyrigaud.adapters.hypervisors.libvirt.metadata import VMMetadata
from pyrigaud.domain.models import Firmware, OwnerMark

from support.libvirt import isolated_host_uri

HOT_ADDABLE = DomainDefinition(
    name="hot-addable",
    domain_type="test",
    vcpus=2,
    max_vcpus=8,
    memory_mib=512,
    max_memory_mib=2048,
    firmware=Firmware.BIOS,
    secure_boot=False,
    disks=(),
    nics=(),
    metadata=VMMetadata(owner=OwnerMark(provider="tests/xml"), created_at=0.0),
)


def defined(tmp_path: Path, xml: str) -> str:
    """What the test driver makes of `xml`: its persistent definition."""
    conn = libvirt.open(isolated_host_uri(tmp_path))
    try:
        return str(conn.defineXML(xml).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    finally:
        conn.close()


def with_dimm(xml: str, size_mib: int) -> str:
    """`xml` with a DIMM plugged, as libvirt writes a domain whose DIMM is persistent."""
    root = ET.fromstring(xml)
    devices = root.find("devices")
    assert devices is not None
    devices.append(ET.fromstring(dimm_xml(size_mib)))
    memory = root.find("memory")
    assert memory is not None
    memory.text = str(int(memory.text or 0) + size_mib * KIB_PER_MIB)
    return ET.tostring(root, encoding="unicode")


def test_memory_hot_add_gets_dimm_slots_and_a_numa_cell_over_every_vcpu(tmp_path: Path) -> None:
    root = ET.fromstring(defined(tmp_path, render_domain(HOT_ADDABLE)))
    max_memory = root.find("maxMemory")
    assert max_memory is not None
    assert max_memory.get("slots") == str(MEMORY_HOTPLUG_SLOTS)
    cell = root.find("cpu/numa/cell")
    assert cell is not None
    assert cell.get("cpus") == "0-7"
    assert int(cell.get("memory", "0")) == 512 * KIB_PER_MIB
    facts = parse_domain(ET.tostring(root, encoding="unicode"))
    assert (facts.vcpus, facts.max_vcpus) == (2, 8)
    assert (facts.memory_mib, facts.max_memory_mib) == (512, 2048)
    assert facts.free_memory_slots == MEMORY_HOTPLUG_SLOTS


def test_without_memory_hot_add_there_are_no_slots_and_no_numa_cell() -> None:
    xml = render_domain(replace(HOT_ADDABLE, max_memory_mib=0))
    root = ET.fromstring(xml)
    assert root.find("maxMemory") is None
    assert root.find("cpu/numa") is None
    assert parse_domain(xml).free_memory_slots == 0


def test_a_dimm_takes_a_slot_and_counts_in_the_total() -> None:
    facts = parse_domain(with_dimm(render_domain(HOT_ADDABLE), 256))
    assert facts.memory_mib == 768
    assert facts.free_memory_slots == MEMORY_HOTPLUG_SLOTS - 1
    dimm = ET.fromstring(dimm_xml(256))
    assert (dimm.get("model"), dimm.findtext("target/node")) == ("dimm", "0")
    assert dimm.findtext("target/size") == str(256 * KIB_PER_MIB)


def test_new_memory_boots_in_the_cell_and_drops_the_dimms_so_none_counts_twice(
    tmp_path: Path,
) -> None:
    plugged = with_dimm(render_domain(HOT_ADDABLE), 256)
    root = ET.fromstring(defined(tmp_path, with_resources(plugged, None, 1024)))
    assert root.findall("devices/memory") == []
    cell = root.find("cpu/numa/cell")
    assert cell is not None
    assert int(cell.get("memory", "0")) == 1024 * KIB_PER_MIB
    assert parse_domain(ET.tostring(root, encoding="unicode")).memory_mib == 1024


def test_new_cpus_keep_the_cell_memory_and_widen_the_cell_beyond_the_headroom() -> None:
    plugged = with_dimm(render_domain(HOT_ADDABLE), 256)
    root = ET.fromstring(with_resources(plugged, 12, None))
    cell = root.find("cpu/numa/cell")
    assert cell is not None
    assert (cell.get("cpus"), int(cell.get("memory", "0"))) == ("0-11", 512 * KIB_PER_MIB)
    assert len(root.findall("devices/memory")) == 1


def test_what_waits_for_a_power_cycle_is_where_live_and_persistent_differ() -> None:
    boot = parse_domain(render_domain(HOT_ADDABLE))
    assert awaiting_power_cycle(boot, boot) == ()
    more_cpus = parse_domain(with_resources(render_domain(HOT_ADDABLE), 4, None))
    assert awaiting_power_cycle(boot, more_cpus) == ("cpu",)
    more_memory = parse_domain(with_resources(render_domain(HOT_ADDABLE), 4, 1024))
    assert awaiting_power_cycle(boot, more_memory) == ("cpu", "memory")
    hot_added = parse_domain(with_dimm(render_domain(HOT_ADDABLE), 512))
    assert awaiting_power_cycle(hot_added, more_memory) == ("cpu",)


def test_secure_boot_asks_for_q35_smm_and_an_enrolled_secure_loader(tmp_path: Path) -> None:
    secure = replace(HOT_ADDABLE, firmware=Firmware.UEFI, secure_boot=True)
    root = ET.fromstring(render_domain(secure))
    os_element = root.find("os")
    assert os_element is not None
    assert os_element.get("firmware") == "efi"
    assert os_element.find("type").get("machine") == "q35"  # type: ignore[union-attr]
    features = {
        feature.get("name"): feature.get("enabled")
        for feature in os_element.iterfind("firmware/feature")
    }
    assert features == {"secure-boot": "yes", "enrolled-keys": "yes"}
    assert root.find("features/smm").get("state") == "on"  # type: ignore[union-attr]
    plain = ET.fromstring(render_domain(replace(secure, secure_boot=False)))
    assert plain.find("os/type").get("machine") is None  # type: ignore[union-attr]
    assert plain.find("features/smm") is None
