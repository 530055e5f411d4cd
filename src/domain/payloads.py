"""The manager's JSON payloads -> domain models, as `Result`s.

The manager marshals Go structs without json tags (PascalCase keys) for Create and
Reconfigure, and CRD specs (camelCase) for Clone and ImagePrepare. Parsing follows Go's
decoder, which the other providers rely on: keys match case-insensitively, unknown keys are
ignored, `null` is accepted for every list and object, and a missing key is the zero value.
Then every value is checked against the bounds in bounds.py, and a failure names the field.

Inside this module a `_PayloadError` unwinds from the point of failure to the public parse
function, which turns it into a `Failure`; nothing raises out of here for bad input.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from functools import wraps
from hashlib import sha256
from typing import ParamSpec, TypeVar
from urllib.parse import urlsplit

from returns.result import Failure, Result, Success

from pyrigaud.domain import bounds
from pyrigaud.domain.bounds import describe_value
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    CloneRequest,
    ContentLibraryItem,
    CreateRequest,
    Customization,
    DiskDefaults,
    DiskQuery,
    DiskSpec,
    ExportRequest,
    Firmware,
    ImageSource,
    ImportRequest,
    NetworkAttachment,
    PerformanceProfile,
    Placement,
    PrepareImageRequest,
    ResourceLimits,
    SecurityProfile,
    SnapshotRequest,
    TransferBackend,
    TransferMode,
    VMChanges,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import MAX_GRACEFUL_TIMEOUT_SECONDS, PowerOp
from pyrigaud.domain.quantity import quantity_to_mib

_P = ParamSpec("_P")
_T = TypeVar("_T")

_FIRMWARE = {"": Firmware.BIOS, "bios": Firmware.BIOS, "uefi": Firmware.UEFI, "efi": Firmware.UEFI}
_MAC = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}")
_DISK_FORMATS = ("qcow2", "raw", "vmdk")
_INT32_MAX = 2**31 - 1


class _PayloadError(Exception):
    def __init__(self, error: ProviderError) -> None:
        super().__init__(error.message)
        self.error = error


def _invalid(field: str, problem: str) -> _PayloadError:
    return _PayloadError(ProviderError.invalid_spec(field, problem))


def _parser(function: Callable[_P, _T]) -> Callable[_P, Result[_T, ProviderError]]:
    """Make a raising parser a Result-returning one (the module's only exit for bad input)."""

    @wraps(function)
    def parse(*args: _P.args, **kwargs: _P.kwargs) -> Result[_T, ProviderError]:
        try:
            return Success(function(*args, **kwargs))
        except _PayloadError as error:
            return Failure(error.error)

    return parse


class _Doc:
    """A JSON object read the way Go's decoder reads it into a struct."""

    def __init__(self, data: Mapping[str, object], path: str) -> None:
        self._path = path
        # Go assigns keys in document order, so among case variants of one key the last wins.
        self._data = {key.casefold(): value for key, value in data.items()}

    def field(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def raw(self, key: str) -> object:
        return self._data.get(key.casefold())

    def text(self, key: str, limit: int = bounds.MAX_STRING_LENGTH) -> str:
        return _as_text(self.raw(key), self.field(key), limit)

    def integer(self, key: str, low: int = -_INT32_MAX - 1, high: int = _INT32_MAX) -> int:
        return _as_int(self.raw(key), self.field(key), low, high)

    def optional_integer(self, key: str, low: int, high: int) -> int | None:
        value = self.raw(key)
        return None if value is None else _as_int(value, self.field(key), low, high)

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise _invalid(self.field(key), f"expected true or false, got {describe_value(value)}")
        return value

    def obj(self, key: str) -> _Doc | None:
        return _as_doc(self.raw(key), self.field(key))

    def objects(self, key: str, most: int) -> list[_Doc]:
        items = _as_list(self.raw(key), self.field(key), most)
        docs = [_as_doc(item, f"{self.field(key)}[{index}]") for index, item in enumerate(items)]
        return [doc if doc is not None else _Doc({}, "") for doc in docs]

    def strings(self, key: str, most: int, limit: int = bounds.MAX_STRING_LENGTH) -> list[str]:
        field = self.field(key)
        items = _as_list(self.raw(key), field, most)
        return [_as_text(item, f"{field}[{index}]", limit) for index, item in enumerate(items)]

    def string_map(self, key: str) -> dict[str, str]:
        field = self.field(key)
        value = self.raw(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise _invalid(field, f"expected an object, got {describe_value(value)}")
        result: dict[str, str] = {}
        for name, item in value.items():
            _check_unicode(name, field)
            if isinstance(item, bool):
                result[name] = "true" if item else "false"
            elif isinstance(item, int | float):
                result[name] = str(item)
            else:
                result[name] = _as_text(item, f"{field}[{describe_value(name)}]")
        return result


def _check_unicode(value: str, field: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(field, "is not valid Unicode text") from None


def _as_text(value: object, field: str, limit: int = bounds.MAX_STRING_LENGTH) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _invalid(field, f"expected a string, got {describe_value(value)}")
    _check_unicode(value, field)
    if len(value) > limit:
        raise _invalid(field, f"must be at most {limit} characters")
    return value


def _as_int(value: object, field: str, low: int, high: int) -> int:
    if value is None:
        number = 0
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(field, f"expected an integer, got {describe_value(value)}")
    elif isinstance(value, float):
        if not value.is_integer():
            raise _invalid(field, f"expected an integer, got {describe_value(value)}")
        number = int(value)
    else:
        number = value
    if not low <= number <= high:
        raise _invalid(field, f"must be between {low} and {high}, got {describe_value(number)}")
    return number


def _as_list(value: object, field: str, most: int) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _invalid(field, f"expected a list, got {describe_value(value)}")
    if len(value) > most:
        raise _invalid(field, f"at most {most} entries are supported, got {len(value)}")
    return value


def _as_doc(value: object, field: str) -> _Doc | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid(field, f"expected an object, got {describe_value(value)}")
    return _Doc(value, field)


def _load(text: str, field: str) -> _Doc:
    """Decode one *_json field; "" and "null" are an empty object, like Go's zero value."""
    if len(text) > bounds.MAX_JSON_PAYLOAD_BYTES:
        raise _invalid(field, f"must be at most {bounds.MAX_JSON_PAYLOAD_BYTES} bytes")
    if not text.strip():
        return _Doc({}, field)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise _invalid(field, f"is not valid JSON ({_short(error)})") from None
    doc = _as_doc(value, field)
    return doc if doc is not None else _Doc({}, field)


def _short(error: Exception) -> str:
    return describe_value(str(error), 80).strip("'\"")


def _name(value: str, field: str) -> str:
    problem = bounds.name_problem(value)
    if problem is not None:
        raise _invalid(field, problem)
    return value


def _cpu(value: int, field: str) -> int:
    if not bounds.MIN_CPU <= value <= bounds.MAX_CPU:
        raise _invalid(field, f"must be between {bounds.MIN_CPU} and {bounds.MAX_CPU}")
    return value


def _memory(value: int, field: str) -> int:
    if not bounds.MIN_MEMORY_MIB <= value <= bounds.MAX_MEMORY_MIB:
        raise _invalid(
            field, f"must be between {bounds.MIN_MEMORY_MIB} and {bounds.MAX_MEMORY_MIB} MiB"
        )
    return value


def _disk_gib(doc: _Doc, key: str, low: int) -> int:
    return doc.integer(key, low, bounds.MAX_DISK_GIB)


def _cloud_init(data: bytes, field: str) -> bytes:
    if len(data) > bounds.MAX_CLOUD_INIT_BYTES:
        raise _invalid(field, f"must be at most {bounds.MAX_CLOUD_INIT_BYTES} bytes")
    return data


def _ip(value: str, field: str, *, allow_prefix: bool = False) -> str:
    if not value:
        return ""
    try:
        if allow_prefix and "/" in value:
            ipaddress.ip_interface(value)
        else:
            ipaddress.ip_address(value)
    except ValueError:
        raise _invalid(field, f"{describe_value(value)} is not an IP address") from None
    return value


# --- Create ---------------------------------------------------------------------------------


def _vm_class(doc: _Doc) -> VMClass:
    firmware = doc.text("Firmware").strip().casefold()
    if firmware not in _FIRMWARE:
        raise _invalid(doc.field("Firmware"), "must be BIOS, UEFI or EFI")
    disk_defaults = doc.obj("DiskDefaults")
    performance = doc.obj("PerformanceProfile")
    security = doc.obj("SecurityProfile")
    limits = doc.obj("ResourceLimits")
    return VMClass(
        cpu=_cpu(doc.integer("CPU"), doc.field("CPU")),
        memory_mib=_memory(doc.integer("MemoryMiB", 0, _INT32_MAX), doc.field("MemoryMiB")),
        firmware=_FIRMWARE[firmware],
        disk_defaults=DiskDefaults(
            type=disk_defaults.text("Type"), size_gib=_disk_gib(disk_defaults, "SizeGiB", 0)
        )
        if disk_defaults
        else DiskDefaults(),
        guest_tools_policy=doc.text("GuestToolsPolicy"),
        extra_config=doc.string_map("ExtraConfig"),
        performance=_performance(performance) if performance else PerformanceProfile(),
        security=_security(security) if security else SecurityProfile(),
        limits=_limits(limits) if limits else ResourceLimits(),
    )


def _performance(doc: _Doc) -> PerformanceProfile:
    return PerformanceProfile(
        latency_sensitivity=doc.text("LatencySensitivity"),
        cpu_hot_add=doc.boolean("CPUHotAddEnabled"),
        memory_hot_add=doc.boolean("MemoryHotAddEnabled"),
        virtualization_based_security=doc.boolean("VirtualizationBasedSecurity"),
        nested_virtualization=doc.boolean("NestedVirtualization"),
        hyper_threading_policy=doc.text("HyperThreadingPolicy"),
    )


def _security(doc: _Doc) -> SecurityProfile:
    return SecurityProfile(
        secure_boot=doc.boolean("SecureBoot"),
        tpm_enabled=doc.boolean("TPMEnabled"),
        tpm_version=doc.text("TPMVersion"),
        vtd_enabled=doc.boolean("VTDEnabled"),
        encryption_enabled=doc.boolean("EncryptionEnabled"),
        key_provider=doc.text("KeyProvider"),
        require_encryption=doc.boolean("RequireEncryption"),
    )


def _limits(doc: _Doc) -> ResourceLimits:
    def limit(key: str) -> int | None:
        return doc.optional_integer(key, 0, _INT32_MAX)

    return ResourceLimits(
        cpu_limit=limit("CPULimit"),
        cpu_reservation=limit("CPUReservation"),
        memory_limit_mib=limit("MemoryLimitMiB"),
        memory_reservation_mib=limit("MemoryReservationMiB"),
        cpu_shares=limit("CPUShares"),
    )


def _vm_image(doc: _Doc) -> VMImage:
    return VMImage(
        template_name=doc.text("TemplateName", 1024),
        path=doc.text("Path", 4096),
        url=doc.text("URL", 8192),
        format=doc.text("Format", 64),
        checksum=doc.text("Checksum", 256),
        checksum_type=doc.text("ChecksumType", 64),
    )


def _network(doc: _Doc) -> NetworkAttachment:
    mac = doc.text("MacAddress", 64).strip()
    if mac and _MAC.fullmatch(mac) is None:
        raise _invalid(doc.field("MacAddress"), f"{describe_value(mac)} is not a MAC address")
    dns_raw = doc.raw("DNS")
    dns = (
        doc.strings("DNS", 16, 256)
        if isinstance(dns_raw, list)
        else [part.strip() for part in doc.text("DNS", 4096).split(",") if part.strip()]
    )
    for index, server in enumerate(dns):
        _ip(server, f"{doc.field('DNS')}[{index}]")
    return NetworkAttachment(
        name=doc.text("Name", 256),
        portgroup=doc.text("Portgroup", 256),
        network_name=doc.text("NetworkName", 256),
        bridge=doc.text("Bridge", 256),
        vlan=doc.integer("VLAN", 0, bounds.MAX_VLAN),
        model=doc.text("Model", 64),
        mac_address=mac.lower(),
        ip_policy=doc.text("IPPolicy", 64),
        static_ip=_ip(doc.text("StaticIP", 64).strip(), doc.field("StaticIP"), allow_prefix=True),
        prefix=doc.integer("Prefix", 0, 128),
        gateway=_ip(doc.text("Gateway", 64).strip(), doc.field("Gateway")),
        dns=tuple(dns),
        pci_slot_number=doc.optional_integer("PCISlotNumber", 0, bounds.MAX_PCI_SLOT),
    )


def _networks(text: str, field: str) -> tuple[NetworkAttachment, ...]:
    return tuple(_network(doc) for doc in _list_payload(text, field, bounds.MAX_NICS))


def _disk(doc: _Doc) -> DiskSpec:
    return DiskSpec(
        size_gib=_disk_gib(doc, "SizeGiB", 1), type=doc.text("Type", 64), name=doc.text("Name", 256)
    )


def _disks(text: str, field: str) -> tuple[DiskSpec, ...]:
    return tuple(_disk(doc) for doc in _list_payload(text, field, bounds.MAX_DISKS))


def _list_payload(text: str, field: str, most: int) -> list[_Doc]:
    """A *_json field holding a list: "" and null are empty, like Go's nil slice."""
    wrapper = f'{{"items": {text}}}' if text.strip() else "{}"
    if len(text) > bounds.MAX_JSON_PAYLOAD_BYTES:
        raise _invalid(field, f"must be at most {bounds.MAX_JSON_PAYLOAD_BYTES} bytes")
    try:
        value = json.loads(wrapper)
    except (ValueError, RecursionError) as error:
        raise _invalid(field, f"is not valid JSON ({_short(error)})") from None
    items = _as_list(value.get("items"), field, most)
    docs = [_as_doc(item, f"{field}[{index}]") for index, item in enumerate(items)]
    return [
        doc if doc is not None else _Doc({}, f"{field}[{index}]") for index, doc in enumerate(docs)
    ]


def _placement(doc: _Doc | None) -> Placement:
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
        raise _invalid("tags", f"at most {bounds.MAX_TAGS} tags are supported")
    for index, tag in enumerate(result):
        _as_text(tag, f"tags[{index}]", bounds.MAX_TAG_LENGTH)
    return result


@_parser
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
        name=_name(name, "name"),
        vm_class=_vm_class(_load(class_json, "class_json")),
        image=_vm_image(_load(image_json, "image_json")),
        networks=_networks(networks_json, "networks_json"),
        disks=_disks(disks_json, "disks_json"),
        placement=_placement(_load(placement_json, "placement_json")),
        user_data=_cloud_init(user_data, "user_data"),
        meta_data=_cloud_init(meta_data, "meta_data"),
        tags=_tags(tags),
    )


# --- Reconfigure ----------------------------------------------------------------------------


@_parser
def parse_reconfigure(desired_json: str) -> VMChanges:
    """The whole desired create request; a missing, null or zero value means "no change"."""
    desired = _load(desired_json, "desired_json")
    vm_class = desired.obj("Class")
    cpu = memory = root_disk = None
    if vm_class is not None:
        cpu_value = vm_class.integer("CPU")
        cpu = _cpu(cpu_value, vm_class.field("CPU")) if cpu_value else None
        memory_value = vm_class.integer("MemoryMiB", 0, _INT32_MAX)
        memory = _memory(memory_value, vm_class.field("MemoryMiB")) if memory_value else None
        disk_defaults = vm_class.obj("DiskDefaults")
        if disk_defaults is not None:
            root_disk = _disk_gib(disk_defaults, "SizeGiB", 0) or None
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


@_parser
def parse_power_op(op: int, graceful_timeout_seconds: int) -> tuple[PowerOp, int]:
    """The wire PowerOp (UNSPECIFIED and unknown values are invalid) and its timeout."""
    try:
        power_op = PowerOp(op)
    except ValueError:
        raise _invalid("op", "must be ON, OFF, REBOOT or SHUTDOWN_GRACEFUL") from None
    if not 0 <= graceful_timeout_seconds <= MAX_GRACEFUL_TIMEOUT_SECONDS:
        raise _invalid(
            "graceful_timeout_seconds", f"must be between 0 and {MAX_GRACEFUL_TIMEOUT_SECONDS}"
        )
    return power_op, graceful_timeout_seconds


@_parser
def parse_hardware_version(target_version: int) -> int:
    """0 means "the newest the host supports"."""
    if not 0 <= target_version <= bounds.MAX_HARDWARE_VERSION:
        raise _invalid("target_version", f"must be between 0 and {bounds.MAX_HARDWARE_VERSION}")
    return target_version


# --- Snapshots ------------------------------------------------------------------------------


@_parser
def parse_snapshot(
    *, vm_id: str, name_hint: str, description: str, include_memory: bool, default_name: str
) -> SnapshotRequest:
    """An empty name hint gets `default_name` (the caller picks one, e.g. from the clock)."""
    return SnapshotRequest(
        vm_id=vm_id,
        name=_name(name_hint or default_name, "name_hint"),
        description=_as_text(description, "description", 4096),
        include_memory=include_memory,
    )


# --- Clone ----------------------------------------------------------------------------------


def _customization(doc: _Doc) -> Customization:
    networks = tuple(
        NetworkAttachment(
            name=item.text("name", 256),
            network_name=item.text("networkName", 256) or item.text("name", 256),
            static_ip=_ip(
                (item.text("ipAddress", 64) or item.text("staticIP", 64)).strip(),
                item.field("ipAddress"),
                allow_prefix=True,
            ),
            prefix=item.integer("prefix", 0, 128),
            gateway=_ip(item.text("gateway", 64).strip(), item.field("gateway")),
            dns=tuple(
                _ip(server.strip(), item.field("dns")) for server in item.strings("dns", 16, 64)
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
        user_data = _cloud_init(inline.encode(), doc.field("userData"))
    hostname = doc.text("hostname", 253)
    if hostname:
        _name(hostname, doc.field("hostname"))
    domain = doc.text("domain", bounds.MAX_DNS_NAME_LENGTH)
    if domain and not all(map(bounds.DNS_LABEL_PATTERN.fullmatch, domain.split("."))):
        raise _invalid(doc.field("domain"), f"{describe_value(domain)} is not a DNS name")
    time_zone = doc.text("timeZone", 128)
    if time_zone and not bounds.TIME_ZONE_PATTERN.fullmatch(time_zone):
        raise _invalid(
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


@_parser
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
    vm_class = _load(class_json, "class_json")
    cpu_value = vm_class.integer("cpu")
    memory_raw = vm_class.raw("memory")
    memory: int | None = None
    if isinstance(memory_raw, str) and memory_raw.strip():
        mib = quantity_to_mib(memory_raw)
        if mib is None:
            raise _invalid(
                "class_json.memory", f"{describe_value(memory_raw)} is not a quantity like 8Gi"
            )
        memory = _memory(mib, "class_json.memory")
    elif memory_raw is not None and not isinstance(memory_raw, str):
        bytes_ = vm_class.integer("memory", 0, 2**63 - 1)
        memory = _memory(-(-bytes_ // (1024 * 1024)), "class_json.memory") if bytes_ else None
    customize = _load(customize_json, "customize_json")
    return CloneRequest(
        source_vm_id=source_vm_id,
        target_name=_name(target_name, "target_name"),
        linked=linked,
        cpu=_cpu(cpu_value, "class_json.cpu") if cpu_value else None,
        memory_mib=memory,
        placement_policy=_load(placement_json, "placement_json").text("name", 256),
        customization=_customization(customize) if customize_json.strip() else None,
    )


# --- ImagePrepare ---------------------------------------------------------------------------


@_parser
def parse_prepare_image(
    *, image_json: str, target_name: str, storage_hint: str
) -> PrepareImageRequest:
    """The CRD's `{"source": {"libvirt"|"vsphere"|"http": {...}}}`, or the flat VMImage shape.

    An empty target name is derived from the source, so repeating the call is idempotent.
    """
    doc = _load(image_json, "image_json")
    source = _image_source(doc)
    if not (source.path or source.url or source.template_name or source.content_library):
        raise _invalid("image_json", "names no image source (path, url or templateName)")
    name = target_name or _derived_image_name(source)
    return PrepareImageRequest(
        source=source,
        target_name=_name(name, "target_name"),
        storage_hint=_as_text(storage_hint, "storage_hint", 1024),
    )


def _image_source(doc: _Doc) -> ImageSource:
    wrapper = doc.obj("source")
    if wrapper is None:
        flat = _vm_image(doc)
        return ImageSource(
            path=flat.path,
            url=flat.url,
            format=flat.format,
            checksum=flat.checksum,
            checksum_type=flat.checksum_type,
            template_name=flat.template_name,
        )
    for origin in ("libvirt", "vsphere", "http"):
        inner = wrapper.obj(origin)
        if inner is None:
            continue
        library = inner.obj("contentLibrary")
        return ImageSource(
            origin=origin,
            path=inner.text("path", 4096),
            url=inner.text("url", 8192) or inner.text("ovaURL", 8192),
            format=inner.text("format", 64),
            checksum=inner.text("checksum", 256),
            checksum_type=inner.text("checksumType", 64),
            storage_pool=inner.text("storagePool", 256),
            template_name=inner.text("templateName", 1024),
            content_library=ContentLibraryItem(
                library=library.text("library", 256),
                item=library.text("item", 256),
                version=library.text("version", 64),
            )
            if library is not None
            else None,
        )
    raise _invalid("image_json.source", "must hold one of libvirt, vsphere or http")


def _derived_image_name(source: ImageSource) -> str:
    basis = source.template_name or source.path or source.url
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", basis.rstrip("/").rsplit("/", 1)[-1])[:48].strip(".-_")
    digest = sha256(basis.encode()).hexdigest()[:8]
    return f"{stem}-{digest}" if stem and stem[0].isalnum() else f"image-{digest}"


# --- Disk transfer --------------------------------------------------------------------------


def _backend(value: str, field: str) -> TransferBackend:
    try:
        return TransferBackend(value.strip().lower() or TransferBackend.PVC)
    except ValueError:
        raise _invalid(field, "must be pvc, nfs or s3") from None


def _mode(value: str, field: str) -> TransferMode:
    try:
        return TransferMode(value.strip().lower() or TransferMode.AUTO)
    except ValueError:
        raise _invalid(field, "must be auto, relay or direct") from None


def _format(value: str, field: str) -> str:
    disk_format = value.strip().lower() or "qcow2"
    if disk_format not in _DISK_FORMATS:
        raise _invalid(field, f"must be one of {', '.join(_DISK_FORMATS)}")
    return disk_format


def _transfer_url(url: str, backend: TransferBackend, field: str) -> str:
    if not url:
        raise _invalid(field, "must not be empty")
    _as_text(url, field, 8192)
    scheme = urlsplit(url).scheme.lower()
    if scheme != backend.value:
        raise _invalid(field, f"must be a {backend.value}:// URL for backend {backend.value}")
    return url


def _storage_options(text: str) -> dict[str, str]:
    return _Doc({"options": _load(text, "storage_options_json")._data}, "").string_map("options")


def _credentials(credentials: Mapping[str, str]) -> dict[str, str]:
    for key in credentials:
        _as_text(key, "credentials", 256)
    return dict(credentials)


@_parser
def parse_export(
    *,
    vm_id: str,
    disk_id: str,
    snapshot_id: str,
    destination_url: str,
    disk_format: str,
    compress: bool,
    credentials: Mapping[str, str],
    backend_type: str,
    transfer_mode: str,
    storage_options_json: str,
) -> ExportRequest:
    backend = _backend(backend_type, "backend_type")
    return ExportRequest(
        vm_id=vm_id,
        disk_id=disk_id,
        snapshot_id=snapshot_id,
        destination_url=_transfer_url(destination_url, backend, "destination_url"),
        format=_format(disk_format, "format"),
        compress=compress,
        credentials=_credentials(credentials),
        backend=backend,
        mode=_mode(transfer_mode, "transfer_mode"),
        storage_options=_storage_options(storage_options_json),
    )


@_parser
def parse_import(
    *,
    source_url: str,
    storage_hint: str,
    disk_format: str,
    target_name: str,
    verify_checksum: bool,
    expected_checksum: str,
    credentials: Mapping[str, str],
    backend_type: str,
    transfer_mode: str,
    storage_options_json: str,
) -> ImportRequest:
    backend = _backend(backend_type, "backend_type")
    if verify_checksum and not expected_checksum:
        raise _invalid("expected_checksum", "must be set when verify_checksum is true")
    return ImportRequest(
        source_url=_transfer_url(source_url, backend, "source_url"),
        storage_hint=_as_text(storage_hint, "storage_hint", 1024),
        format=_format(disk_format, "format"),
        target_name=_name(target_name, "target_name") if target_name else "",
        verify_checksum=verify_checksum,
        expected_checksum=_as_text(expected_checksum, "expected_checksum", 256),
        credentials=_credentials(credentials),
        backend=backend,
        mode=_mode(transfer_mode, "transfer_mode"),
        storage_options=_storage_options(storage_options_json),
    )


def disk_query(vm_id: str, disk_id: str, snapshot_id: str) -> DiskQuery:
    """GetDiskInfo's ids need no validation: ids that name nothing are simply missing."""
    return DiskQuery(vm_id=vm_id, disk_id=disk_id, snapshot_id=snapshot_id)
