"""Create, Reconfigure, Power, HardwareUpgrade, SnapshotCreate and Clone payloads -> domain.

The manager marshals Go structs without json tags (PascalCase keys) for Create and
Reconfigure, and CRD specs (camelCase) for Clone; `document` reads both the Go way. Every value
is checked against the domain's bounds, and a failure names the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pyrigaud.domain import bounds, fields
from pyrigaud.domain.bounds import describe_value
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    Customization,
    DiskDefaults,
    DiskSpec,
    Firmware,
    NetworkAttachment,
    PerformanceProfile,
    Placement,
    ResourceLimits,
    SecurityProfile,
    SnapshotRequest,
    VMChanges,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import MAX_GRACEFUL_TIMEOUT_SECONDS, PowerOp
from pyrigaud.domain.quantity import quantity_to_mib
from pyrigaud.entrypoints.grpc.wire.document import (
    INT32_MAX,
    Document,
    as_text,
    checked_cloud_init,
    checked_cpu,
    checked_ip,
    checked_memory,
    checked_name,
    disk_gib,
    invalid,
    load,
    load_list,
    parser,
)

_FIRMWARE = {"": Firmware.BIOS, "bios": Firmware.BIOS, "uefi": Firmware.UEFI, "efi": Firmware.UEFI}
_MAC = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}")


def _vm_class(doc: Document) -> VMClass:
    firmware = doc.text("Firmware").strip().casefold()
    if firmware not in _FIRMWARE:
        raise invalid(doc.field("Firmware"), "must be BIOS, UEFI or EFI")
    disk_defaults = doc.obj("DiskDefaults")
    performance = doc.obj("PerformanceProfile")
    security = doc.obj("SecurityProfile")
    limits = doc.obj("ResourceLimits")
    return VMClass(
        cpu=checked_cpu(doc.integer("CPU"), doc.field("CPU")),
        memory_mib=checked_memory(doc.integer("MemoryMiB", 0, INT32_MAX), doc.field("MemoryMiB")),
        firmware=_FIRMWARE[firmware],
        disk_defaults=DiskDefaults(
            type=disk_defaults.text("Type"), size_gib=disk_gib(disk_defaults, "SizeGiB", 0)
        )
        if disk_defaults
        else DiskDefaults(),
        guest_tools_policy=doc.text("GuestToolsPolicy"),
        extra_config=doc.string_map("ExtraConfig"),
        performance=_performance(performance) if performance else PerformanceProfile(),
        security=_security(security) if security else SecurityProfile(),
        limits=_limits(limits) if limits else ResourceLimits(),
    )


def _performance(doc: Document) -> PerformanceProfile:
    return PerformanceProfile(
        latency_sensitivity=doc.text("LatencySensitivity"),
        cpu_hot_add=doc.boolean("CPUHotAddEnabled"),
        memory_hot_add=doc.boolean("MemoryHotAddEnabled"),
        virtualization_based_security=doc.boolean("VirtualizationBasedSecurity"),
        nested_virtualization=doc.boolean("NestedVirtualization"),
        hyper_threading_policy=doc.text("HyperThreadingPolicy"),
    )


def _security(doc: Document) -> SecurityProfile:
    return SecurityProfile(
        secure_boot=doc.boolean("SecureBoot"),
        tpm_enabled=doc.boolean("TPMEnabled"),
        tpm_version=doc.text("TPMVersion"),
        vtd_enabled=doc.boolean("VTDEnabled"),
        encryption_enabled=doc.boolean("EncryptionEnabled"),
        key_provider=doc.text("KeyProvider"),
        require_encryption=doc.boolean("RequireEncryption"),
    )


def _limits(doc: Document) -> ResourceLimits:
    def limit(key: str) -> int | None:
        return doc.optional_integer(key, 0, INT32_MAX)

    return ResourceLimits(
        cpu_limit=limit("CPULimit"),
        cpu_reservation=limit("CPUReservation"),
        memory_limit_mib=limit("MemoryLimitMiB"),
        memory_reservation_mib=limit("MemoryReservationMiB"),
        cpu_shares=limit("CPUShares"),
    )


def vm_image(doc: Document) -> VMImage:
    return VMImage(
        template_name=doc.text("TemplateName", 1024),
        path=doc.text("Path", 4096),
        url=doc.text("URL", 8192),
        format=doc.text("Format", 64),
        checksum=doc.text("Checksum", 256),
        checksum_type=doc.text("ChecksumType", 64),
    )


def _network(doc: Document) -> NetworkAttachment:
    mac = doc.text("MacAddress", 64).strip()
    if mac and _MAC.fullmatch(mac) is None:
        raise invalid(doc.field("MacAddress"), f"{describe_value(mac)} is not a MAC address")
    dns_raw = doc.raw("DNS")
    dns = (
        doc.strings("DNS", 16, 256)
        if isinstance(dns_raw, list)
        else [part.strip() for part in doc.text("DNS", 4096).split(",") if part.strip()]
    )
    for index, server in enumerate(dns):
        checked_ip(server, f"{doc.field('DNS')}[{index}]")
    return NetworkAttachment(
        name=doc.text("Name", 256),
        portgroup=doc.text("Portgroup", 256),
        network_name=doc.text("NetworkName", 256),
        bridge=doc.text("Bridge", 256),
        vlan=doc.integer("VLAN", 0, bounds.MAX_VLAN),
        model=doc.text("Model", 64),
        mac_address=mac.lower(),
        ip_policy=doc.text("IPPolicy", 64),
        static_ip=checked_ip(
            doc.text("StaticIP", 64).strip(), doc.field("StaticIP"), allow_prefix=True
        ),
        prefix=doc.integer("Prefix", 0, 128),
        gateway=checked_ip(doc.text("Gateway", 64).strip(), doc.field("Gateway")),
        dns=tuple(dns),
        pci_slot_number=doc.optional_integer("PCISlotNumber", 0, bounds.MAX_PCI_SLOT),
    )


def _networks(text: str, field: str) -> tuple[NetworkAttachment, ...]:
    return tuple(_network(doc) for doc in load_list(text, field, bounds.MAX_NICS))


def _disk(doc: Document) -> DiskSpec:
    return DiskSpec(
        size_gib=disk_gib(doc, "SizeGiB", 1), type=doc.text("Type", 64), name=doc.text("Name", 256)
    )


def _disks(text: str, field: str) -> tuple[DiskSpec, ...]:
    return tuple(_disk(doc) for doc in load_list(text, field, bounds.MAX_DISKS))


def _placement(doc: Document | None) -> Placement:
    if doc is None:
        return Placement()
    return Placement(
        datastore=doc.text("Datastore", 1024),
        storage_pod=doc.text("StoragePod", 1024),
        cluster=doc.text("Cluster", 1024),
        folder=doc.text("Folder", 1024),
        host=doc.text("Host", 1024),
    )


def _tags(tags: Iterable[str]) -> tuple[str, ...]:
    result = tuple(tags)
    if len(result) > bounds.MAX_TAGS:
        raise invalid(fields.TAGS, f"at most {bounds.MAX_TAGS} tags are supported")
    for index, tag in enumerate(result):
        as_text(tag, f"{fields.TAGS}[{index}]", bounds.MAX_TAG_LENGTH)
    return result


@parser
def parse_create(
    *,
    name: str,
    class_json: str,
    image_json: str = "",
    networks_json: str = "",
    disks_json: str = "",
    placement_json: str = "",
    user_data: bytes = b"",
    meta_data: bytes = b"",
    tags: Iterable[str] = (),
) -> CreateRequest:
    """CreateRequest's payloads, as the manager sends them (Go field names)."""
    return CreateRequest(
        name=checked_name(name, fields.NAME),
        vm_class=_vm_class(load(class_json, fields.CLASS)),
        image=vm_image(load(image_json, fields.IMAGE)),
        networks=_networks(networks_json, fields.NETWORKS),
        disks=_disks(disks_json, fields.DISKS),
        placement=_placement(load(placement_json, fields.PLACEMENT)),
        user_data=checked_cloud_init(user_data, fields.USER_DATA),
        meta_data=checked_cloud_init(meta_data, fields.META_DATA),
        tags=_tags(tags),
    )


# --- Reconfigure ----------------------------------------------------------------------------


@parser
def parse_reconfigure(desired_json: str) -> VMChanges:
    """The whole desired create request; a missing, null or zero value means "no change"."""
    desired = load(desired_json, fields.DESIRED)
    vm_class = desired.obj("Class")
    cpu = memory = root_disk = None
    if vm_class is not None:
        cpu_value = vm_class.integer("CPU")
        cpu = checked_cpu(cpu_value, vm_class.field("CPU")) if cpu_value else None
        memory_value = vm_class.integer("MemoryMiB", 0, INT32_MAX)
        memory = checked_memory(memory_value, vm_class.field("MemoryMiB")) if memory_value else None
        disk_defaults = vm_class.obj("DiskDefaults")
        if disk_defaults is not None:
            root_disk = disk_gib(disk_defaults, "SizeGiB", 0) or None
    disks = tuple(
        DiskSpec(
            size_gib=doc.integer("SizeGiB", 0, bounds.MAX_DISK_GIB),
            type=doc.text("Type"),
            name=doc.text("Name", 256),
        )
        for doc in desired.objects("Disks", bounds.MAX_DISKS)
    )
    return VMChanges(cpu=cpu, memory_mib=memory, root_disk_gib=root_disk, disks=disks)


# --- Power ----------------------------------------------------------------------------------


@parser
def parse_power_op(op: int, graceful_timeout_seconds: int) -> tuple[PowerOp, int]:
    """The wire PowerOp (UNSPECIFIED and unknown values are invalid) and its timeout."""
    try:
        power_op = PowerOp(op)
    except ValueError:
        raise invalid(fields.POWER_OP, "must be ON, OFF, REBOOT or SHUTDOWN_GRACEFUL") from None
    if not 0 <= graceful_timeout_seconds <= MAX_GRACEFUL_TIMEOUT_SECONDS:
        raise invalid(
            fields.GRACEFUL_TIMEOUT, f"must be between 0 and {MAX_GRACEFUL_TIMEOUT_SECONDS}"
        )
    return power_op, graceful_timeout_seconds


@parser
def parse_hardware_version(target_version: int) -> int:
    """0 means "the newest the host supports"."""
    if not 0 <= target_version <= bounds.MAX_HARDWARE_VERSION:
        raise invalid(fields.TARGET_VERSION, f"must be between 0 and {bounds.MAX_HARDWARE_VERSION}")
    return target_version


# --- Snapshots ------------------------------------------------------------------------------


@parser
def parse_snapshot(
    *, vm_id: str, name_hint: str, description: str, include_memory: bool, default_name: str
) -> SnapshotRequest:
    """An empty name hint gets `default_name` (the caller picks one, e.g. from the clock)."""
    return SnapshotRequest(
        vm_id=vm_id,
        name=checked_name(name_hint or default_name, fields.NAME_HINT),
        description=as_text(description, fields.DESCRIPTION, 4096),
        include_memory=include_memory,
    )


# --- Clone ----------------------------------------------------------------------------------


def _customization(doc: Document) -> Customization:
    networks = tuple(
        NetworkAttachment(
            name=item.text("name", 256),
            network_name=item.text("networkName", 256) or item.text("name", 256),
            static_ip=checked_ip(
                (item.text("ipAddress", 64) or item.text("staticIP", 64)).strip(),
                item.field("ipAddress"),
                allow_prefix=True,
            ),
            prefix=item.integer("prefix", 0, 128),
            gateway=checked_ip(item.text("gateway", 64).strip(), item.field("gateway")),
            dns=tuple(
                checked_ip(server.strip(), item.field("dns"))
                for server in item.strings("dns", 16, 64)
            ),
        )
        for item in doc.objects("networks", bounds.MAX_NICS)
    )
    user_data = b""
    user_data_doc = doc.obj("userData")
    if user_data_doc is not None:
        cloud_init = user_data_doc.obj("cloudInit")
        inline = (
            cloud_init.text("inline", bounds.MAX_CLOUD_INIT_BYTES)
            if cloud_init is not None
            else user_data_doc.text("cloudInitData", bounds.MAX_CLOUD_INIT_BYTES)
        )
        user_data = checked_cloud_init(inline.encode(), doc.field("userData"))
    hostname = doc.text("hostname", 253)
    if hostname:
        checked_name(hostname, doc.field("hostname"))
    domain = doc.text("domain", bounds.MAX_DNS_NAME_LENGTH)
    if domain and not all(map(bounds.DNS_LABEL_PATTERN.fullmatch, domain.split("."))):
        raise invalid(doc.field("domain"), f"{describe_value(domain)} is not a DNS name")
    time_zone = doc.text("timeZone", 128)
    if time_zone and not bounds.TIME_ZONE_PATTERN.fullmatch(time_zone):
        raise invalid(
            doc.field("timeZone"),
            f"{describe_value(time_zone)} is not a zone name like Europe/Berlin",
        )
    return Customization(
        hostname=hostname,
        domain=domain,
        time_zone=time_zone,
        networks=networks,
        user_data=user_data,
    )


@parser
def parse_clone(
    *,
    source_vm_id: str,
    target_name: str,
    linked: bool,
    class_json: str,
    placement_json: str,
    customize_json: str,
) -> CloneRequest:
    """Clone sends CRD specs: camelCase keys, memory as a Kubernetes quantity ("8Gi")."""
    vm_class = load(class_json, fields.CLASS)
    cpu_value = vm_class.integer("cpu")
    memory_raw = vm_class.raw("memory")
    memory: int | None = None
    if isinstance(memory_raw, str) and memory_raw.strip():
        mib = quantity_to_mib(memory_raw)
        if mib is None:
            raise invalid(
                fields.CLONE_MEMORY, f"{describe_value(memory_raw)} is not a quantity like 8Gi"
            )
        memory = checked_memory(mib, fields.CLONE_MEMORY)
    elif memory_raw is not None and not isinstance(memory_raw, str):
        bytes_ = vm_class.integer("memory", 0, 2**63 - 1)
        memory = (
            checked_memory(-(-bytes_ // (1024 * 1024)), fields.CLONE_MEMORY) if bytes_ else None
        )
    customize = load(customize_json, fields.CUSTOMIZE)
    return CloneRequest(
        source_vm_id=source_vm_id,
        target_name=checked_name(target_name, fields.TARGET_NAME),
        linked=linked,
        cpu=checked_cpu(cpu_value, fields.CLONE_CPU) if cpu_value else None,
        memory_mib=memory,
        placement_policy=load(placement_json, fields.PLACEMENT).text("name", 256),
        customization=_customization(customize) if customize_json.strip() else None,
    )
