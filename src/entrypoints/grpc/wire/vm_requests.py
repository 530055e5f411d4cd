"""Create, Reconfigure, Power, HardwareUpgrade and SnapshotCreate payloads -> domain.

The manager marshals Go structs without json tags (PascalCase keys) for Create and
Reconfigure (Clone's CRD specs are `clone_requests.py`); `document` reads them the Go way.
Every value is checked against the domain's bounds, and a failure names the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import partial

from returns.result import Result, Success

from pyrigaud.domain import bounds
from pyrigaud.domain.bounds import describe_value
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    CreateRequest,
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
from pyrigaud.entrypoints.grpc.wire import field_names as names
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
    each,
    each_at,
    invalid,
    load,
    load_list,
)

_FIRMWARE = {"": Firmware.BIOS, "bios": Firmware.BIOS, "uefi": Firmware.UEFI, "efi": Firmware.UEFI}
_MAC = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}")


def _firmware(doc: Document) -> Result[Firmware, ProviderError]:
    def known(spelled: str) -> Result[Firmware, ProviderError]:
        firmware = spelled.strip().casefold()
        if firmware not in _FIRMWARE:
            return invalid(doc.field("Firmware"), "must be BIOS, UEFI or EFI")
        return Success(_FIRMWARE[firmware])

    return doc.text("Firmware").bind(known)


def _vm_class(doc: Document) -> Result[VMClass, ProviderError]:
    return Result.do(
        VMClass(
            cpu=cpu,
            memory_mib=memory_mib,
            firmware=firmware,
            disk_defaults=disk_defaults,
            guest_tools_policy=guest_tools_policy,
            extra_config=extra_config,
            performance=performance,
            security=security,
            limits=limits,
        )
        for firmware in _firmware(doc)
        for disk_defaults_doc in doc.obj("DiskDefaults")
        for performance_doc in doc.obj("PerformanceProfile")
        for security_doc in doc.obj("SecurityProfile")
        for limits_doc in doc.obj("ResourceLimits")
        for cpu_value in doc.integer("CPU")
        for cpu in checked_cpu(cpu_value, doc.field("CPU"))
        for memory_value in doc.integer("MemoryMiB", 0, INT32_MAX)
        for memory_mib in checked_memory(memory_value, doc.field("MemoryMiB"))
        for disk_defaults in _disk_defaults(disk_defaults_doc)
        for guest_tools_policy in doc.text("GuestToolsPolicy")
        for extra_config in doc.string_map("ExtraConfig")
        for performance in _performance(performance_doc)
        for security in _security(security_doc)
        for limits in _limits(limits_doc)
    )


def _disk_defaults(doc: Document | None) -> Result[DiskDefaults, ProviderError]:
    if doc is None:
        return Success(DiskDefaults())
    return Result.do(
        DiskDefaults(type=disk_type, size_gib=size_gib)
        for disk_type in doc.text("Type")
        for size_gib in disk_gib(doc, "SizeGiB", 0)
    )


def _performance(doc: Document | None) -> Result[PerformanceProfile, ProviderError]:
    if doc is None:
        return Success(PerformanceProfile())
    return Result.do(
        PerformanceProfile(
            latency_sensitivity=latency_sensitivity,
            cpu_hot_add=cpu_hot_add,
            memory_hot_add=memory_hot_add,
            virtualization_based_security=virtualization_based_security,
            nested_virtualization=nested_virtualization,
            hyper_threading_policy=hyper_threading_policy,
        )
        for latency_sensitivity in doc.text("LatencySensitivity")
        for cpu_hot_add in doc.boolean("CPUHotAddEnabled")
        for memory_hot_add in doc.boolean("MemoryHotAddEnabled")
        for virtualization_based_security in doc.boolean("VirtualizationBasedSecurity")
        for nested_virtualization in doc.boolean("NestedVirtualization")
        for hyper_threading_policy in doc.text("HyperThreadingPolicy")
    )


def _security(doc: Document | None) -> Result[SecurityProfile, ProviderError]:
    if doc is None:
        return Success(SecurityProfile())
    return Result.do(
        SecurityProfile(
            secure_boot=secure_boot,
            tpm_enabled=tpm_enabled,
            tpm_version=tpm_version,
            vtd_enabled=vtd_enabled,
            encryption_enabled=encryption_enabled,
            key_provider=key_provider,
            require_encryption=require_encryption,
        )
        for secure_boot in doc.boolean("SecureBoot")
        for tpm_enabled in doc.boolean("TPMEnabled")
        for tpm_version in doc.text("TPMVersion")
        for vtd_enabled in doc.boolean("VTDEnabled")
        for encryption_enabled in doc.boolean("EncryptionEnabled")
        for key_provider in doc.text("KeyProvider")
        for require_encryption in doc.boolean("RequireEncryption")
    )


def _limits(doc: Document | None) -> Result[ResourceLimits, ProviderError]:
    if doc is None:
        return Success(ResourceLimits())

    def limit(key: str) -> Result[int | None, ProviderError]:
        return doc.optional_integer(key, 0, INT32_MAX)

    return Result.do(
        ResourceLimits(
            cpu_limit=cpu_limit,
            cpu_reservation=cpu_reservation,
            memory_limit_mib=memory_limit_mib,
            memory_reservation_mib=memory_reservation_mib,
            cpu_shares=cpu_shares,
        )
        for cpu_limit in limit("CPULimit")
        for cpu_reservation in limit("CPUReservation")
        for memory_limit_mib in limit("MemoryLimitMiB")
        for memory_reservation_mib in limit("MemoryReservationMiB")
        for cpu_shares in limit("CPUShares")
    )


def vm_image(doc: Document) -> Result[VMImage, ProviderError]:
    return Result.do(
        VMImage(
            template_name=template_name,
            path=path,
            url=url,
            format=image_format,
            checksum=checksum,
            checksum_type=checksum_type,
        )
        for template_name in doc.text("TemplateName", 1024)
        for path in doc.text("Path", 4096)
        for url in doc.text("URL", 8192)
        for image_format in doc.text("Format", 64)
        for checksum in doc.text("Checksum", 256)
        for checksum_type in doc.text("ChecksumType", 64)
    )


def _mac(doc: Document) -> Result[str, ProviderError]:
    def checked(text: str) -> Result[str, ProviderError]:
        mac = text.strip()
        if mac and _MAC.fullmatch(mac) is None:
            return invalid(doc.field("MacAddress"), f"{describe_value(mac)} is not a MAC address")
        return Success(mac.lower())

    return doc.text("MacAddress", 64).bind(checked)


def _dns(doc: Document) -> Result[tuple[str, ...], ProviderError]:
    """A list of servers, or one comma-separated string of them."""
    listed = (
        doc.strings("DNS", 16, 256)
        if isinstance(doc.raw("DNS"), list)
        else doc.text("DNS", 4096).map(_comma_separated)
    )
    return Result.do(
        checked for servers in listed for checked in each_at(servers, doc.field("DNS"), checked_ip)
    )


def _comma_separated(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _network(doc: Document) -> Result[NetworkAttachment, ProviderError]:
    return Result.do(
        NetworkAttachment(
            name=name,
            portgroup=portgroup,
            network_name=network_name,
            bridge=bridge,
            vlan=vlan,
            model=model,
            mac_address=mac,
            ip_policy=ip_policy,
            static_ip=static_ip,
            prefix=prefix,
            gateway=gateway,
            dns=dns,
            pci_slot_number=pci_slot_number,
        )
        for mac in _mac(doc)
        for dns in _dns(doc)
        for name in doc.text("Name", 256)
        for portgroup in doc.text("Portgroup", 256)
        for network_name in doc.text("NetworkName", 256)
        for bridge in doc.text("Bridge", 256)
        for vlan in doc.integer("VLAN", 0, bounds.MAX_VLAN)
        for model in doc.text("Model", 64)
        for ip_policy in doc.text("IPPolicy", 64)
        for static_ip_text in doc.text("StaticIP", 64)
        for static_ip in checked_ip(
            static_ip_text.strip(), doc.field("StaticIP"), allow_prefix=True
        )
        for prefix in doc.integer("Prefix", 0, 128)
        for gateway_text in doc.text("Gateway", 64)
        for gateway in checked_ip(gateway_text.strip(), doc.field("Gateway"))
        for pci_slot_number in doc.optional_integer("PCISlotNumber", 0, bounds.MAX_PCI_SLOT)
    )


def _networks(text: str, field: str) -> Result[tuple[NetworkAttachment, ...], ProviderError]:
    return load_list(text, field, bounds.MAX_NICS).bind(partial(each, check=_network))


def _disk(doc: Document) -> Result[DiskSpec, ProviderError]:
    return Result.do(
        DiskSpec(size_gib=size_gib, type=disk_type, name=name)
        for size_gib in disk_gib(doc, "SizeGiB", 1)
        for disk_type in doc.text("Type", 64)
        for name in doc.text("Name", 256)
    )


def _disks(text: str, field: str) -> Result[tuple[DiskSpec, ...], ProviderError]:
    return load_list(text, field, bounds.MAX_DISKS).bind(partial(each, check=_disk))


def _placement(doc: Document) -> Result[Placement, ProviderError]:
    return Result.do(
        Placement(
            datastore=datastore, storage_pod=storage_pod, cluster=cluster, folder=folder, host=host
        )
        for datastore in doc.text("Datastore", 1024)
        for storage_pod in doc.text("StoragePod", 1024)
        for cluster in doc.text("Cluster", 1024)
        for folder in doc.text("Folder", 1024)
        for host in doc.text("Host", 1024)
    )


def _tags(tags: Iterable[str]) -> Result[tuple[str, ...], ProviderError]:
    given = tuple(tags)
    if len(given) > bounds.MAX_TAGS:
        return invalid(names.TAGS, f"at most {bounds.MAX_TAGS} tags are supported")
    return each_at(given, names.TAGS, partial(as_text, limit=bounds.MAX_TAG_LENGTH))


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
) -> Result[CreateRequest, ProviderError]:
    """CreateRequest's payloads, as the manager sends them (Go field names)."""
    return Result.do(
        CreateRequest(
            name=checked,
            vm_class=vm_class,
            image=image,
            networks=networks,
            disks=disks,
            placement=placement,
            user_data=checked_user_data,
            meta_data=checked_meta_data,
            tags=checked_tags,
        )
        for checked in checked_name(name, names.NAME)
        for vm_class in load(class_json, names.CLASS).bind(_vm_class)
        for image in load(image_json, names.IMAGE).bind(vm_image)
        for networks in _networks(networks_json, names.NETWORKS)
        for disks in _disks(disks_json, names.DISKS)
        for placement in load(placement_json, names.PLACEMENT).bind(_placement)
        for checked_user_data in checked_cloud_init(user_data, names.USER_DATA)
        for checked_meta_data in checked_cloud_init(meta_data, names.META_DATA)
        for checked_tags in _tags(tags)
    )


# --- Reconfigure ----------------------------------------------------------------------------


def parse_reconfigure(desired_json: str) -> Result[VMChanges, ProviderError]:
    """The whole desired create request; a missing, null or zero value means "no change"."""
    return Result.do(
        VMChanges(cpu=cpu, memory_mib=memory, root_disk_gib=root_disk, disks=disks)
        for desired in load(desired_json, names.DESIRED)
        for vm_class in desired.obj("Class")
        for cpu in _changed_cpu(vm_class)
        for memory in _changed_memory(vm_class)
        for root_disk in _changed_root_disk(vm_class)
        for disk_docs in desired.objects("Disks", bounds.MAX_DISKS)
        for disks in each(disk_docs, _desired_disk)
    )


def _changed_cpu(vm_class: Document | None) -> Result[int | None, ProviderError]:
    if vm_class is None:
        return Success(None)
    return vm_class.integer("CPU").bind(partial(_changed, checked_cpu, vm_class.field("CPU")))


def _changed_memory(vm_class: Document | None) -> Result[int | None, ProviderError]:
    if vm_class is None:
        return Success(None)
    return vm_class.integer("MemoryMiB", 0, INT32_MAX).bind(
        partial(_changed, checked_memory, vm_class.field("MemoryMiB"))
    )


def _changed(
    check: Callable[[int, str], Result[int, ProviderError]], field: str, value: int
) -> Result[int | None, ProviderError]:
    """A zero value asks no change; any other is checked."""
    return check(value, field) if value else Success(None)


def _changed_root_disk(vm_class: Document | None) -> Result[int | None, ProviderError]:
    if vm_class is None:
        return Success(None)
    return vm_class.obj("DiskDefaults").bind(_changed_size)


def _changed_size(defaults: Document | None) -> Result[int | None, ProviderError]:
    if defaults is None:
        return Success(None)
    return Result.do(size or None for size in disk_gib(defaults, "SizeGiB", 0))


def _desired_disk(doc: Document) -> Result[DiskSpec, ProviderError]:
    return Result.do(
        DiskSpec(size_gib=size_gib, type=disk_type, name=name)
        for size_gib in doc.integer("SizeGiB", 0, bounds.MAX_DISK_GIB)
        for disk_type in doc.text("Type")
        for name in doc.text("Name", 256)
    )


# --- Power ----------------------------------------------------------------------------------


def parse_power_op(
    op: int, graceful_timeout_seconds: int
) -> Result[tuple[PowerOp, int], ProviderError]:
    """The wire PowerOp (UNSPECIFIED and unknown values are invalid) and its timeout."""
    try:
        power_op = PowerOp(op)
    except ValueError:
        return invalid(names.POWER_OP, "must be ON, OFF, REBOOT or SHUTDOWN_GRACEFUL")
    if not 0 <= graceful_timeout_seconds <= MAX_GRACEFUL_TIMEOUT_SECONDS:
        return invalid(
            names.GRACEFUL_TIMEOUT, f"must be between 0 and {MAX_GRACEFUL_TIMEOUT_SECONDS}"
        )
    return Success((power_op, graceful_timeout_seconds))


def parse_hardware_version(target_version: int) -> Result[int, ProviderError]:
    """0 means "the newest the host supports"."""
    if not 0 <= target_version <= bounds.MAX_HARDWARE_VERSION:
        return invalid(names.TARGET_VERSION, f"must be between 0 and {bounds.MAX_HARDWARE_VERSION}")
    return Success(target_version)


# --- Snapshots ------------------------------------------------------------------------------


def parse_snapshot(
    *, vm_id: str, name_hint: str, description: str, include_memory: bool, default_name: str
) -> Result[SnapshotRequest, ProviderError]:
    """An empty name hint gets `default_name` (the caller picks one, e.g. from the clock)."""
    return Result.do(
        SnapshotRequest(
            vm_id=vm_id, name=name, description=checked_description, include_memory=include_memory
        )
        for name in checked_name(name_hint or default_name, names.NAME_HINT)
        for checked_description in as_text(description, names.DESCRIPTION, 4096)
    )
