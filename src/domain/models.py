"""What a VM *is*, as pyrigaud understands it: frozen values, no I/O.

These are parsed from the manager's JSON payloads (see entrypoints/grpc/wire) and handed to the
hypervisor adapters; they are also what adapters report back (VMInfo, VMDescription, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import Field

from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import Firmware as Firmware  # noqa: PLC0414
from pyrigaud.domain.hardware import VirtualHardware
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.staging import StagedLocation

# Re-exported: every caller knows them from models.
from pyrigaud.domain.staging import StagingType as StagingType  # noqa: PLC0414
from pyrigaud.domain.values import Value as Value  # noqa: PLC0414

# The format an export writes and an import reads when the request names none.
DEFAULT_DISK_FORMAT = "qcow2"


class DiskDefaults(Value):
    type: str = ""
    size_gib: int = 0  # 0: the backend's default root disk size


class PerformanceProfile(Value):
    latency_sensitivity: str = ""
    cpu_hot_add: bool = False
    memory_hot_add: bool = False
    virtualization_based_security: bool = False
    nested_virtualization: bool = False
    hyper_threading_policy: str = ""


class SecurityProfile(Value):
    secure_boot: bool = False
    tpm_enabled: bool = False
    tpm_version: str = ""
    vtd_enabled: bool = False
    encryption_enabled: bool = False
    key_provider: str = ""
    require_encryption: bool = False


class ResourceLimits(Value):
    cpu_limit: int | None = None
    cpu_reservation: int | None = None
    memory_limit_mib: int | None = None
    memory_reservation_mib: int | None = None
    cpu_shares: int | None = None


class VMClass(Value):
    cpu: int
    memory_mib: int
    firmware: Firmware = Firmware.BIOS
    disk_defaults: DiskDefaults = DiskDefaults()
    guest_tools_policy: str = ""
    extra_config: Mapping[str, str] = Field(default_factory=dict)
    performance: PerformanceProfile = PerformanceProfile()
    security: SecurityProfile = SecurityProfile()
    limits: ResourceLimits = ResourceLimits()

    def refusal(self) -> ProviderError | None:
        """Why no hypervisor can make a VM of this class, or None: secure boot is UEFI's.

        What one hypervisor cannot do (a TPM version, a host without the firmware) is that
        backend's to say."""
        if self.security.secure_boot and self.firmware is not Firmware.UEFI:
            return ProviderError.invalid_spec(fields.CLASS_SECURE_BOOT, "needs firmware UEFI")
        return None


class VMImage(Value):
    """Where the root disk comes from. Nothing set means "no image": a blank root disk."""

    template_name: str = ""
    path: str = ""
    url: str = ""
    format: str = ""
    checksum: str = ""
    checksum_type: str = ""

    @property
    def is_blank(self) -> bool:
        return not (self.template_name or self.path or self.url)


class NetworkAttachment(Value):
    name: str = ""
    portgroup: str = ""
    network_name: str = ""
    bridge: str = ""
    vlan: int = 0
    model: str = ""
    mac_address: str = ""
    ip_policy: str = ""
    static_ip: str = ""
    prefix: int = 0
    gateway: str = ""
    dns: tuple[str, ...] = ()
    pci_slot_number: int | None = None


class DiskSpec(Value):
    size_gib: int
    type: str = ""
    name: str = ""


class Placement(Value):
    datastore: str = ""
    storage_pod: str = ""
    cluster: str = ""
    folder: str = ""
    host: str = ""


class OwnerMark(Value):
    """Which provider made a VM: VMs carrying another mark (or none) are not ours to adopt."""

    provider: str


class CreateRequest(Value):
    name: str
    vm_class: VMClass
    image: VMImage = VMImage()
    networks: tuple[NetworkAttachment, ...] = ()
    disks: tuple[DiskSpec, ...] = ()
    placement: Placement = Placement()
    user_data: bytes = b""
    meta_data: bytes = b""
    tags: tuple[str, ...] = ()
    # What the guest of an imported disk (`image.path`) boots on, from its import's record:
    # the backend gives it the nearest equivalent. None: nothing known (not an import, or an
    # upstream export without a manifest).
    hardware: VirtualHardware | None = None


class VMChanges(Value):
    """Reconfigure's desired state; None means "no change" (the key was missing, null or 0)."""

    cpu: int | None = None
    memory_mib: int | None = None
    root_disk_gib: int | None = None
    disks: tuple[DiskSpec, ...] = ()  # extra disks by position; they only grow

    @property
    def is_empty(self) -> bool:
        return (
            self.cpu is None
            and self.memory_mib is None
            and self.root_disk_gib is None
            and (not self.disks)
        )


class Customization(Value):
    hostname: str = ""
    domain: str = ""
    time_zone: str = ""
    networks: tuple[NetworkAttachment, ...] = ()
    user_data: bytes = b""


class CloneRequest(Value):
    source_vm_id: str
    target_name: str
    linked: bool = False
    cpu: int | None = None
    memory_mib: int | None = None
    placement_policy: str = ""
    customization: Customization | None = None


class ContentLibraryItem(Value):
    library: str = ""
    item: str = ""
    version: str = ""


class ImageSource(Value):
    """ImagePrepare's source: the union of the CRD's libvirt / vsphere / http sources."""

    origin: str = ""  # "libvirt", "vsphere", "http" or "" for the flat VMImage shape
    path: str = ""
    url: str = ""
    format: str = ""
    checksum: str = ""
    checksum_type: str = ""
    storage_pool: str = ""
    template_name: str = ""
    content_library: ContentLibraryItem | None = None


class PrepareImageRequest(Value):
    source: ImageSource
    target_name: str = ""
    storage_hint: str = ""


class PreparedImage(Value):
    id: str
    path: str = ""


class Snapshot(Value):
    id: str
    name: str
    description: str = ""
    include_memory: bool = False


class SnapshotRequest(Value):
    vm_id: str
    name: str
    description: str = ""
    include_memory: bool = False


class DiskInfo(Value):
    id: str
    path: str = ""
    size_gib: int = 0
    format: str = ""


class NetworkInfo(Value):
    name: str = ""
    mac: str = ""
    ip_address: str = ""


class VMInfo(Value):
    """One row of ListVMs."""

    id: str
    name: str
    power_state: PowerState
    ips: tuple[str, ...] = ()
    cpu: int = 0
    memory_mib: int = 0
    disks: tuple[DiskInfo, ...] = ()
    networks: tuple[NetworkInfo, ...] = ()
    provider_raw: Mapping[str, str] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VMDescription:
    """What Describe reports of an existing VM.

    A plain frozen dataclass, not a validated `Value`: Describe builds one per call (about
    1,000 a second at 10,000 VMs) from values its adapter has already typed, and validating
    them again cost about a third of the fake backend's time per Describe.
    """

    power_state: PowerState
    ips: tuple[str, ...] = ()
    console_url: str = ""
    raw: Mapping[str, str] = field(default_factory=dict)


class VMRecord(Value):
    """A VM found by name, with its ownership mark (None: not made by any pyrigaud).

    `building_since` is set while a Create is still putting the VM together, or after one died
    doing so: the Unix time that Create began, recorded on the hypervisor with the VM itself.
    """

    id: str
    name: str
    owner: OwnerMark | None = None
    building_since: float | None = None


class DiskDetails(Value):
    disk_id: str
    format: str = ""
    virtual_size_bytes: int = 0
    actual_size_bytes: int = 0
    path: str = ""
    is_bootable: bool = False
    snapshots: tuple[str, ...] = ()
    backing_file: str = ""
    metadata: Mapping[str, str] = Field(default_factory=dict)


class DiskQuery(Value):
    vm_id: str
    disk_id: str = ""  # "": the boot disk
    snapshot_id: str = ""


class DiskRead(Value):
    """What an export asks the hypervisor to read: one disk of a VM (`disk_id`; "" its root
    disk) at a point in time (`snapshot_id`; None: as it is now) in `format`. Nothing of where
    the bytes go (the staging location, its credentials) reaches the hypervisor."""

    vm_id: str
    disk_id: str = ""
    snapshot_id: str | None = None
    format: str = DEFAULT_DISK_FORMAT


class TransferMode(StrEnum):
    """How the disk bytes travel. The manager resolves "auto" (and an empty mode) to relay:
    through the provider, between the hypervisor and the staging store."""

    RELAY = "relay"
    DIRECT = "direct"


class ExportRequest(Value):
    """`destination` is the request's destination_url, storage options and credentials, parsed
    and checked once (by the wire parser): the only form a use case or a backend sees."""

    vm_id: str
    disk_id: str = ""
    snapshot_id: str = ""
    destination: StagedLocation = Field(repr=False)
    format: str = DEFAULT_DISK_FORMAT
    compress: bool = False
    mode: TransferMode = TransferMode.RELAY

    @property
    def staged(self) -> StagedLocation:
        """Where the disk is staged: the destination."""
        return self.destination

    @property
    def staging_type(self) -> StagingType:
        return self.destination.staging_type


class ExportResult(Value):
    export_id: str
    estimated_size_bytes: int = 0
    checksum: str = ""


class ImportRequest(Value):
    """`source` is the request's source_url, storage options and credentials, parsed and
    checked once (by the wire parser): the only form a use case or a backend sees."""

    source: StagedLocation = Field(repr=False)
    storage_hint: str = ""
    format: str = DEFAULT_DISK_FORMAT
    target_name: str = ""
    verify_checksum: bool = False
    expected_checksum: str = ""
    mode: TransferMode = TransferMode.RELAY

    @property
    def staged(self) -> StagedLocation:
        """Where the disk is staged: the source."""
        return self.source

    @property
    def staging_type(self) -> StagingType:
        return self.source.staging_type


class ImportResult(Value):
    disk_id: str
    path: str = ""
    actual_size_bytes: int = 0
    checksum: str = ""


class Capabilities(Value):
    """What a backend can do; use cases refuse what it cannot, consistently with this."""

    supports_reconfigure_online: bool = False
    supports_disk_expansion_online: bool = False
    supports_snapshots: bool = False
    supports_memory_snapshots: bool = False
    supports_linked_clones: bool = False
    supports_image_import: bool = False
    supported_disk_types: tuple[str, ...] = ()
    supported_network_types: tuple[str, ...] = ()
    supports_disk_export: bool = False
    supports_disk_import: bool = False
    supported_export_formats: tuple[str, ...] = ()
    supported_import_formats: tuple[str, ...] = ()
    supports_export_compression: bool = False
    supported_export_backends: tuple[str, ...] = ()
    supported_import_backends: tuple[str, ...] = ()
    supported_transfer_modes: tuple[str, ...] = ()
    supports_clone: bool = False  # not on the wire: Clone answers UNIMPLEMENTED when False
    supports_hardware_upgrade: bool = False  # not on the wire either


class HealthReport(Value):
    ok: bool
    message: str = ""
