"""Domain XML, built and read with ElementTree (user input never meets string formatting)."""

from __future__ import annotations

import hashlib
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from pyrigaud.adapters.hypervisors.libvirt.metadata import (
    NAMESPACE_URI,
    VMMetadata,
    parse_metadata,
)
from pyrigaud.domain.models import Firmware

KIB_PER_MIB = 1024
HOT_ADD_FACTOR = 4  # hot-add headroom: up to 4x the created size without a reboot
MEMORY_HOTPLUG_SLOTS = 16
# Secure boot needs SMM, which the default i440fx machine lacks.
SECURE_BOOT_MACHINE = "q35"
# On a PCI Express machine (q35) every PCI device sits behind a root port of its own, and
# libvirt adds none to spare: a domain gets one per device it boots with (its disks, NICs and
# the USB, virtio-serial and balloon controllers libvirt adds) plus these, free for
# Reconfigure's live disk attach.
HOTPLUG_ROOT_PORTS = 8
LIBVIRT_PCI_DEVICES = 3
DISK_TARGETS = "abcdefghijklmnopqrstuvwxyz"
SAS_CONTROLLER = "lsisas1068"  # the LSI SAS 1068, whose disks need a world wide name
# A disk's target name follows its bus (libvirt derives a drive's address from it); SCSI, SATA
# and USB disks share the `sd` names.
TARGET_PREFIXES = {"virtio": "vd", "ide": "hd"}
SCSI_BUS = "scsi"


@dataclass(frozen=True, slots=True)
class DiskDevice:
    path: str
    format: str
    target: str
    bus: str = "virtio"
    controller: str = ""  # a SCSI disk's controller model (libvirt's word: vmpvscsi, ...)


@dataclass(frozen=True, slots=True)
class NicDevice:
    kind: str  # "network", "bridge" or "user"
    source: str = ""
    model: str = "virtio"
    mac: str = ""


@dataclass(frozen=True)
class DomainDefinition:
    name: str
    domain_type: str
    vcpus: int
    max_vcpus: int
    memory_mib: int
    max_memory_mib: int  # 0: no memory hot-add
    firmware: Firmware
    secure_boot: bool
    disks: tuple[DiskDevice, ...]
    nics: tuple[NicDevice, ...]
    metadata: VMMetadata
    seed_path: str = ""  # the cloud-init NoCloud ISO, attached as a read-only cdrom
    uuid: str = ""  # chosen up front when the seed's instance-id must name it
    pcie: bool = False  # a PCI Express machine: spare root ports for hot-plug
    tpm_version: str = ""  # "": no TPM; else an emulated one (swtpm) of this version


@dataclass(frozen=True, slots=True)
class DomainFacts:
    """What pyrigaud reads back from a domain's XML."""

    name: str
    uuid: str
    vcpus: int
    max_vcpus: int
    memory_mib: int
    max_memory_mib: int
    free_memory_slots: int  # for hot-added DIMMs; 0 without memory hot-add
    firmware: str
    disks: tuple[DiskDevice, ...]
    nics: tuple[NicDevice, ...]
    vnc_port: int | None
    metadata: VMMetadata | None


def disk_target(index: int, bus: str = "virtio") -> str:
    return f"{TARGET_PREFIXES.get(bus, 'sd')}{DISK_TARGETS[index]}"


def render_domain(definition: DomainDefinition) -> str:
    root = ET.Element("domain", {"type": definition.domain_type})
    ET.SubElement(root, "name").text = definition.name
    if definition.uuid:
        ET.SubElement(root, "uuid").text = definition.uuid
    metadata = ET.SubElement(root, "metadata")
    metadata.append(definition.metadata.element(qualified=True))
    if definition.max_memory_mib:
        ET.SubElement(
            root,
            "maxMemory",
            {"slots": str(MEMORY_HOTPLUG_SLOTS), "unit": "KiB"},
        ).text = str(definition.max_memory_mib * KIB_PER_MIB)
    _set_memory(root, definition.memory_mib)
    ET.SubElement(
        root, "vcpu", {"placement": "static", "current": str(definition.vcpus)}
    ).text = str(definition.max_vcpus)
    os_attributes = {"firmware": "efi"} if definition.firmware is Firmware.UEFI else {}
    os_element = ET.SubElement(root, "os", os_attributes)
    machine = {"machine": SECURE_BOOT_MACHINE} if definition.secure_boot else {}
    ET.SubElement(os_element, "type", machine).text = "hvm"
    # Without ACPI, QEMU guests ignore graceful shutdown and the PCI bus refuses hot-plug.
    features = ET.SubElement(root, "features")
    ET.SubElement(features, "acpi")
    ET.SubElement(features, "apic")
    if definition.secure_boot:
        firmware = ET.SubElement(os_element, "firmware")
        for feature in ("secure-boot", "enrolled-keys"):  # the loader and varstore to pick
            ET.SubElement(firmware, "feature", {"enabled": "yes", "name": feature})
        ET.SubElement(features, "smm", {"state": "on"})
    ET.SubElement(os_element, "boot", {"dev": "hd"})
    if definition.max_memory_mib:
        _set_numa_cell(root, definition.max_vcpus, definition.memory_mib)
    devices = ET.SubElement(root, "devices")
    for disk in definition.disks:
        devices.append(disk_element(disk))
    scsi_controller = next(
        (disk.controller for disk in definition.disks if disk.bus == SCSI_BUS and disk.controller),
        "",
    )
    if scsi_controller:  # one, the imported root disk's: index 0, where `sd` targets go
        attributes = {"type": "scsi", "index": "0", "model": scsi_controller}
        ET.SubElement(devices, "controller", attributes)
    if definition.seed_path:
        devices.append(_seed_on_free_target(devices, definition.seed_path))
    for nic in definition.nics:
        devices.append(_nic_element(nic))
    ET.SubElement(devices, "serial", {"type": "pty"})
    ET.SubElement(devices, "console", {"type": "pty"})
    devices.append(_guest_agent_channel())
    if definition.tpm_version:
        devices.append(_tpm_element(definition.tpm_version))
    ET.SubElement(devices, "graphics", {"type": "vnc", "autoport": "yes", "listen": "127.0.0.1"})
    if definition.pcie or definition.secure_boot:
        ET.SubElement(devices, "controller", {"type": "pci", "index": "0", "model": "pcie-root"})
        ports = len(definition.disks) + len(definition.nics) + LIBVIRT_PCI_DEVICES
        for index in range(1, ports + HOTPLUG_ROOT_PORTS + 1):
            attributes = {"type": "pci", "index": str(index), "model": "pcie-root-port"}
            ET.SubElement(devices, "controller", attributes)
    return ET.tostring(root, encoding="unicode")


def _tpm_element(version: str) -> ET.Element:
    """An emulated TPM: tpm-crb for 2.0 (what UEFI guests expect), tpm-tis for 1.2."""
    element = ET.Element("tpm", {"model": "tpm-crb" if version == "2.0" else "tpm-tis"})
    ET.SubElement(element, "backend", {"type": "emulator", "version": version})
    return element


def _guest_agent_channel() -> ET.Element:
    """The virtio-serial port qemu-guest-agent listens on: guest addresses and clean shutdown."""
    element = ET.Element("channel", {"type": "unix"})
    ET.SubElement(element, "target", {"type": "virtio", "name": "org.qemu.guest_agent.0"})
    return element


def disk_element(disk: DiskDevice) -> ET.Element:
    element = ET.Element("disk", {"type": "file", "device": "disk"})
    ET.SubElement(element, "driver", {"name": "qemu", "type": disk.format})
    ET.SubElement(element, "source", {"file": disk.path})
    ET.SubElement(element, "target", {"dev": disk.target, "bus": disk.bus})
    if disk.controller == SAS_CONTROLLER:
        ET.SubElement(element, "wwn").text = sas_wwn(disk.path)
    return element


def sas_wwn(path: str) -> str:
    """A SAS disk's world wide name: without one QEMU gives the disk SAS address 0, and
    Linux's mptsas attaches no disk there (the guest boots from the BIOS and then finds no
    root disk). An NAA-5 name made from the disk's path: stable, and distinct per disk."""
    return f"0x5{hashlib.sha256(path.encode()).hexdigest()[:15]}"


def seed_element(path: str) -> ET.Element:
    """A SATA cdrom: q35 has no IDE, and cloud-init finds the `cidata` label on any bus."""
    element = ET.Element("disk", {"type": "file", "device": "cdrom"})
    ET.SubElement(element, "driver", {"name": "qemu", "type": "raw"})
    ET.SubElement(element, "source", {"file": path})
    ET.SubElement(element, "target", {"dev": "sda", "bus": "sata"})
    ET.SubElement(element, "readonly")
    return element


def _nic_element(nic: NicDevice) -> ET.Element:
    element = ET.Element("interface", {"type": nic.kind})
    if nic.mac:
        ET.SubElement(element, "mac", {"address": nic.mac})
    if nic.kind == "network":
        ET.SubElement(element, "source", {"network": nic.source})
    elif nic.kind == "bridge":
        ET.SubElement(element, "source", {"bridge": nic.source})
    ET.SubElement(element, "model", {"type": nic.model})
    return element


def parse_domain(xml: str) -> DomainFacts:
    """One pass over the top level and one over <devices>: ListVMs parses every domain.

    Same answers as path lookups (first match wins, document order), without ElementPath.
    """
    root = ET.fromstring(xml)  # noqa: S314 - libvirt's own output
    top: dict[str, ET.Element] = {}
    devices: list[ET.Element] = []
    ours = None
    for child in root:
        top.setdefault(child.tag, child)
        if child.tag == "devices":
            devices.extend(child)
        elif child.tag == "metadata" and ours is None:
            ours = child.find(_OUR_METADATA_TAG)
    scsi_models = {
        node.get("index", "0"): node.get("model", "")
        for node in devices
        if node.tag == "controller" and node.get("type") == SCSI_BUS
    }
    vcpu = top.get("vcpu")
    max_vcpus = int(vcpu.text or 1) if vcpu is not None else 1
    vcpus = int(vcpu.get("current", max_vcpus)) if vcpu is not None else 1
    os_element = top.get("os")
    firmware = "BIOS"
    if os_element is not None and (
        os_element.get("firmware") == "efi" or os_element.find("loader") is not None
    ):
        firmware = "UEFI"
    vnc = next(
        (node for node in devices if node.tag == "graphics" and node.get("type") == "vnc"), None
    )
    port = int(vnc.get("port", "-1")) if vnc is not None else -1
    max_memory = top.get("maxMemory")
    slots = int(max_memory.get("slots", "0")) if max_memory is not None else 0
    dimms = sum(1 for node in devices if node.tag == "memory")
    return DomainFacts(
        name=_text(top.get("name")),
        uuid=_text(top.get("uuid")),
        vcpus=vcpus,
        max_vcpus=max_vcpus,
        memory_mib=_kib_of(top.get("memory")) // KIB_PER_MIB,
        max_memory_mib=_kib_of(max_memory) // KIB_PER_MIB,
        free_memory_slots=max(0, slots - dimms),
        firmware=firmware,
        disks=tuple(
            disk
            for node in devices
            if node.tag == "disk"
            and node.get("device") == "disk"
            and (disk := _parse_disk(node, scsi_models)) is not None
        ),
        nics=tuple(_parse_nic(node) for node in devices if node.tag == "interface"),
        vnc_port=port if port > 0 else None,
        metadata=parse_metadata(ours) if ours is not None else None,
    )


_OUR_METADATA_TAG = f"{{{NAMESPACE_URI}}}vm"


def _text(element: ET.Element | None) -> str:
    return (element.text or "") if element is not None else ""


def _parse_disk(element: ET.Element, scsi_models: dict[str, str]) -> DiskDevice | None:
    """A file-backed disk, or None for one without a source (an empty drive); a SCSI disk
    with the model of the controller its address names (`scsi_models`, by index)."""
    source = element.find("source")
    if source is None:
        return None
    driver = element.find("driver")
    target = element.find("target")
    bus = target.get("bus", "") if target is not None else ""
    controller = ""
    if bus == SCSI_BUS:
        address = element.find("address")
        index = address.get("controller", "0") if address is not None else "0"
        controller = scsi_models.get(index, "")
    # A host's domains repeat formats, targets and NIC words: one string each, interned.
    return DiskDevice(
        path=source.get("file") or source.get("dev") or source.get("volume") or "",
        format=sys.intern(driver.get("type", "raw")) if driver is not None else "raw",
        target=sys.intern(target.get("dev", "")) if target is not None else "",
        bus=sys.intern(bus),
        controller=sys.intern(controller),
    )


def _parse_nic(element: ET.Element) -> NicDevice:
    source = element.find("source")
    kind = element.get("type", "")
    name = ""
    if source is not None:
        name = source.get("network") or source.get("bridge") or ""
    mac = element.find("mac")
    model = element.find("model")
    return NicDevice(
        kind=sys.intern(kind),
        source=sys.intern(name),
        model=sys.intern(model.get("type", "")) if model is not None else "",
        mac=mac.get("address", "") if mac is not None else "",
    )


def with_resources(xml: str, vcpus: int | None, memory_mib: int | None) -> str:
    """The (inactive) domain XML with new CPU and memory, keeping hot-add headroom valid."""
    root = ET.fromstring(xml)  # noqa: S314 - libvirt's own output
    vcpu = root.find("vcpu")
    if vcpu is None:
        vcpu = ET.SubElement(root, "vcpu")
    max_vcpus = int(vcpu.text or 1)
    if vcpus is not None:
        max_vcpus = max(max_vcpus, vcpus)
        vcpu.text = str(max_vcpus)
        vcpu.set("current", str(vcpus))
    max_memory = root.find("maxMemory")
    if memory_mib is not None:
        if max_memory is not None and _kib(root, "maxMemory") < memory_mib * KIB_PER_MIB:
            max_memory.text = str(memory_mib * KIB_PER_MIB)
            max_memory.set("unit", "KiB")
        _set_memory(root, memory_mib)
        # The new total boots as one cell: DIMMs kept here would count twice.
        devices = root.find("devices")
        if devices is not None:
            for dimm in devices.findall("memory"):
                devices.remove(dimm)
    if root.find("cpu/numa/cell") is not None:
        _set_numa_cell(root, max_vcpus, memory_mib)
    return ET.tostring(root, encoding="unicode")


def dimm_xml(size_mib: int) -> str:
    """A DIMM for NUMA cell 0 (the only one pyrigaud defines): live memory hot-add."""
    element = ET.Element("memory", {"model": "dimm"})
    target = ET.SubElement(element, "target")
    ET.SubElement(target, "size", {"unit": "KiB"}).text = str(size_mib * KIB_PER_MIB)
    ET.SubElement(target, "node").text = "0"
    return ET.tostring(element, encoding="unicode")


def awaiting_power_cycle(live: DomainFacts, persistent: DomainFacts) -> tuple[str, ...]:
    """What the next boot changes: the running domain differs from its definition."""
    waiting = []
    if live.vcpus != persistent.vcpus:
        waiting.append("cpu")
    if live.memory_mib != persistent.memory_mib:
        waiting.append("memory")
    return tuple(waiting)


def cloned_domain(
    xml: str,
    *,
    name: str,
    vcpus: int | None,
    memory_mib: int | None,
    disk_paths: dict[str, str],
    metadata: VMMetadata,
    dropped_media: frozenset[str] = frozenset(),
    uuid: str = "",
    macs: tuple[str, ...] = (),
    seed_path: str = "",
) -> str:
    """A copy of `xml` under a new name: new disks, `macs` by position or none (libvirt makes
    new ones), and `uuid` or none (libvirt makes one).

    Cdroms on `dropped_media` (the source's own cloud-init seed, which names the source and
    goes when it is deleted) are left out; `seed_path` is the clone's own seed, attached.
    """
    root = ET.fromstring(with_resources(xml, vcpus, memory_mib))  # noqa: S314 - our output
    name_element = root.find("name")
    assert name_element is not None  # libvirt always writes <name>
    name_element.text = name
    for removable in ("uuid", "devices/graphics"):
        for element in root.findall(removable):
            _parent(root, element).remove(element)
    if uuid:
        ET.SubElement(root, "uuid").text = uuid
    for mac in root.findall("devices/interface/mac"):
        _parent(root, mac).remove(mac)
    for interface, address in zip(root.findall("devices/interface"), macs, strict=False):
        interface.insert(0, ET.Element("mac", {"address": address}))
    for target in root.findall("devices/interface/target"):
        _parent(root, target).remove(target)
    for cdrom in root.findall("devices/disk[@device='cdrom']"):
        source = cdrom.find("source")
        if source is not None and source.get("file", "") in dropped_media:
            _parent(root, cdrom).remove(cdrom)
    for source in root.findall("devices/disk/source"):
        source.set("file", disk_paths.get(source.get("file", ""), source.get("file", "")))
    devices = root.find("devices")
    if devices is not None:
        if seed_path:
            devices.append(_seed_on_free_target(devices, seed_path))
        ET.SubElement(
            devices, "graphics", {"type": "vnc", "autoport": "yes", "listen": "127.0.0.1"}
        )
    holder = root.find("metadata")
    if holder is None:
        holder = ET.SubElement(root, "metadata")
    for element in holder.findall(f"{{{NAMESPACE_URI}}}vm"):
        holder.remove(element)
    holder.append(metadata.element(qualified=True))
    return ET.tostring(root, encoding="unicode")


def _seed_on_free_target(devices: ET.Element, path: str) -> ET.Element:
    """The seed cdrom on the first SATA name no disk or kept cdrom already uses (a root disk
    on SCSI or SATA takes `sda`)."""
    taken = {target.get("dev") for target in devices.findall("disk/target")}
    element = seed_element(path)
    target = element.find("target")
    assert target is not None  # seed_element writes one
    target.set("dev", next(f"sd{letter}" for letter in DISK_TARGETS if f"sd{letter}" not in taken))
    return element


def _parent(root: ET.Element, child: ET.Element) -> ET.Element:
    return next(node for node in root.iter() if child in list(node))


def _kib(root: ET.Element, tag: str) -> int:
    """A memory element's value in KiB, whatever unit libvirt wrote it in."""
    return _kib_of(root.find(tag))


_KIB_SCALE = {"KiB": 1, "k": 1, "MiB": 1024, "M": 1024, "GiB": 1024**2, "G": 1024**2}


def _kib_of(element: ET.Element | None) -> int:
    if element is None or not element.text:
        return 0
    return int(element.text) * _KIB_SCALE.get(element.get("unit", "KiB"), 1)


def _set_memory(root: ET.Element, memory_mib: int) -> None:
    for tag in ("memory", "currentMemory"):
        element = root.find(tag)
        if element is None:
            element = ET.SubElement(root, tag)
        element.attrib = {"unit": "KiB"}
        element.text = str(memory_mib * KIB_PER_MIB)


def _set_numa_cell(root: ET.Element, max_vcpus: int, memory_mib: int | None) -> None:
    """Memory hotplug needs a NUMA cell that spans every vCPU and all boot memory (`None`:
    the cell keeps its memory)."""
    cpu = root.find("cpu")
    if cpu is None:
        cpu = ET.SubElement(root, "cpu")
    numa = cpu.find("numa")
    if numa is None:
        numa = ET.SubElement(cpu, "numa")
    cell = numa.find("cell")
    if cell is None:
        cell = ET.SubElement(numa, "cell", {"id": "0"})
    cell.set("cpus", f"0-{max_vcpus - 1}")
    if memory_mib is not None:
        cell.set("memory", str(memory_mib * KIB_PER_MIB))
        cell.set("unit", "KiB")
