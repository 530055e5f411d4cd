"""An in-memory hypervisor that behaves like a real one, for unit tests and the demo server.

It implements every port. New VMs start powered off; guests get an address once running
(after `ip_delay_seconds`); a graceful shutdown completes after `guest_shutdown_seconds`
unless the guest is made to ignore it; snapshots restore CPU and memory; clones are full
copies or overlays on the source's disks. All state sits behind one lock, and injected
latency is served outside it, so a slow Create never stalls Describe.
"""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.fake.faults import FakeFaults
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.addresses import routable_addresses
from pyrigaud.domain.bounds import DEFAULT_ROOT_DISK_GIB
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    Capabilities,
    CloneRequest,
    CreateRequest,
    DiskDetails,
    DiskInfo,
    DiskQuery,
    ExportRequest,
    ExportResult,
    HealthReport,
    ImportRequest,
    ImportResult,
    NetworkAttachment,
    NetworkInfo,
    OwnerMark,
    PreparedImage,
    PrepareImageRequest,
    Snapshot,
    SnapshotRequest,
    VMChanges,
    VMDescription,
    VMInfo,
    VMRecord,
)
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskState

GIB = 1024**3
LATEST_HARDWARE_VERSION = 21
IMAGE_DIR = "/var/lib/fake/images"
DISK_DIR = "/var/lib/fake/disks"

FAKE_CAPABILITIES = Capabilities(
    supports_reconfigure_online=True,
    supports_disk_expansion_online=True,
    supports_snapshots=True,
    supports_memory_snapshots=True,
    supports_linked_clones=True,
    supports_image_import=True,
    supported_disk_types=("thin", "thick", "eagerzeroedthick", "qcow2", "raw"),
    supported_network_types=("network", "bridge", "user"),
    supports_disk_export=True,
    supports_disk_import=True,
    supported_export_formats=("qcow2", "raw"),
    supported_import_formats=("qcow2", "raw"),
    supports_export_compression=True,
    supported_export_backends=("pvc",),
    supported_import_backends=("pvc",),
    supported_transfer_modes=("auto", "direct"),
    supports_clone=True,
    supports_hardware_upgrade=True,
)


@dataclass
class _Disk:
    id: str
    path: str
    size_gib: int
    format: str = "qcow2"
    backing_file: str = ""


@dataclass
class _Nic:
    name: str
    mac: str


@dataclass
class _SnapshotState:
    snapshot: Snapshot
    cpu: int
    memory_mib: int
    disk_sizes: list[int]
    running: bool


@dataclass
class _VM:
    id: str
    name: str
    owner: OwnerMark | None
    cpu: int
    memory_mib: int
    disks: list[_Disk]
    nics: list[_Nic]
    cpu_hot_add: bool = False
    memory_hot_add: bool = False
    firmware: str = "BIOS"
    running: bool = False
    paused: bool = False
    started_at: float = 0.0
    shutdown_requested_at: float | None = None
    shutdown_deadline: int | None = None
    pending_restart: bool = False
    hardware_version: int = 19
    tags: tuple[str, ...] = ()
    hostname: str = ""
    building_since: float | None = None
    snapshots: dict[str, _SnapshotState] = field(default_factory=dict)


@dataclass
class _Image:
    id: str
    path: str
    size_gib: int
    format: str = "qcow2"


class FakeHypervisor:
    """Thread-safe; the test hooks (add_image, add_foreign_vm, pause, faults) are public."""

    def __init__(
        self,
        clock: Clock,
        *,
        faults: FakeFaults | None = None,
        capabilities: Capabilities = FAKE_CAPABILITIES,
        datastores: tuple[str, ...] = ("default",),
        ip_delay_seconds: float = 0.0,
        guest_shutdown_seconds: float = 0.0,
        latency: Mapping[str, float] | None = None,
    ) -> None:
        self.faults = faults or FakeFaults()
        for operation, seconds in (latency or {}).items():
            self.faults.slow(operation, seconds)
        self.guest_honors_shutdown = True
        self._clock = clock
        self._capabilities = capabilities
        self._datastores = datastores
        self._ip_delay = ip_delay_seconds
        self._guest_shutdown_seconds = guest_shutdown_seconds
        self._lock = threading.RLock()
        self._vms: dict[str, _VM] = {}
        self._ids_by_name: dict[str, str] = {}
        self._images: dict[str, _Image] = {}  # by path
        self._templates: dict[str, _Image] = {}  # by name
        self._loose_disks: dict[str, _Disk] = {}  # imported, not attached
        self._exports: set[str] = set()
        self._counter = itertools.count(1)

    # --- test hooks ---------------------------------------------------------------------------

    def add_image(self, path: str, size_gib: int = 2, disk_format: str = "qcow2") -> None:
        """A base image file that exists on the "host" (as if an operator put it there)."""
        with self._lock:
            self._images[path] = _Image(id=path, path=path, size_gib=size_gib, format=disk_format)

    def add_template(self, name: str, size_gib: int = 16) -> None:
        with self._lock:
            self._templates[name] = _Image(id=name, path=f"[templates] {name}", size_gib=size_gib)

    def add_foreign_vm(self, name: str, owner: OwnerMark | None = None) -> str:
        """A VM someone else made (no ownership mark, or another provider's)."""
        with self._lock:
            vm = self._new_vm(name, owner, cpu=1, memory_mib=512, disks=[], nics=[])
            return vm.id

    def add_unfinished_vm(self, name: str, owner: OwnerMark, building_since: float) -> str:
        """A VM as a Create killed part-way leaves it: still marked as building."""
        with self._lock:
            vm = self._new_vm(name, owner, cpu=1, memory_mib=512, disks=[], nics=[])
            vm.building_since = building_since
            return vm.id

    def finish_building(self, vm_id: str) -> None:
        """What another replica's Create does when it completes."""
        with self._lock:
            self._vms[vm_id].building_since = None

    def pause(self, vm_id: str) -> None:
        with self._lock:
            self._vms[vm_id].paused = True

    # --- VMLifecycle --------------------------------------------------------------------------

    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        with self._operation("find_by_name") as failed:
            if failed:
                return Failure(failed[0])
            vm_id = self._ids_by_name.get(name)
            if vm_id is None:
                return Success(None)
            return Success(self._record(self._vms[vm_id]))

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        with self._operation("find_unfinished") as failed:
            if failed:
                return Failure(failed[0])
            return Success(
                [self._record(vm) for vm in self._vms.values() if vm.building_since is not None]
            )

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """Made within the call: no task."""
        return self.create(request, owner).map(lambda vm_id: CreatedVM(id=vm_id))

    def create(self, request: CreateRequest, owner: OwnerMark) -> Result[str, ProviderError]:
        with self._operation("create") as failed:
            if failed:
                return Failure(failed[0])
            existing = self._ids_by_name.get(request.name)
            if existing is not None:
                return self._adopt(existing, owner)
            datastore = request.placement.datastore or self._datastores[0]
            if datastore not in self._datastores:
                return Failure(
                    ProviderError.invalid_spec(
                        "placement_json.Datastore", f"no datastore named {datastore!r}"
                    )
                )
            root = self._root_disk(request)
            if isinstance(root, ProviderError):
                return Failure(root)
            disks = [root] + [
                self._blank_disk(request.name, index, spec.size_gib)
                for index, spec in enumerate(request.disks, start=1)
            ]
            vm = self._new_vm(
                request.name,
                owner,
                cpu=request.vm_class.cpu,
                memory_mib=request.vm_class.memory_mib,
                disks=disks,
                nics=[self._nic(attachment) for attachment in request.networks],
            )
            vm.cpu_hot_add = request.vm_class.performance.cpu_hot_add
            vm.memory_hot_add = request.vm_class.performance.memory_hot_add
            vm.firmware = request.vm_class.firmware.value
            vm.tags = request.tags
            return Success(vm.id)

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        with self._operation("delete") as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.pop(vm_id, None)
            if vm is None:
                return Failure(ProviderError.vm_not_found(vm_id))
            del self._ids_by_name[vm.name]
            return Success(None)

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[None, ProviderError]:
        with self._operation("reconfigure") as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.get(vm_id)
            if vm is None:
                return Failure(ProviderError.vm_not_found(vm_id))
            running = self._running(vm)
            if changes.cpu is not None:
                vm.pending_restart |= running and not vm.cpu_hot_add
                vm.cpu = changes.cpu
            if changes.memory_mib is not None:
                vm.pending_restart |= running and not vm.memory_hot_add
                vm.memory_mib = changes.memory_mib
            if changes.root_disk_gib is not None and vm.disks:
                vm.disks[0].size_gib = max(vm.disks[0].size_gib, changes.root_disk_gib)
            for position, spec in enumerate(changes.disks, start=1):
                if position < len(vm.disks):
                    vm.disks[position].size_gib = max(vm.disks[position].size_gib, spec.size_gib)
                elif spec.size_gib:
                    vm.disks.append(self._blank_disk(vm.name, position, spec.size_gib))
            return Success(None)

    def upgrade_hardware(self, vm_id: str, target_version: int) -> Result[None, ProviderError]:
        with self._operation("upgrade_hardware") as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.get(vm_id)
            if vm is None:
                return Failure(ProviderError.vm_not_found(vm_id))
            target = target_version or LATEST_HARDWARE_VERSION
            if self._running(vm):
                return Failure(
                    ProviderError.failed_precondition("power the VM off to upgrade its hardware")
                )
            if target > LATEST_HARDWARE_VERSION:
                return Failure(
                    ProviderError.failed_precondition(
                        f"the host supports hardware versions up to {LATEST_HARDWARE_VERSION}"
                    )
                )
            if target < vm.hardware_version:
                return Failure(
                    ProviderError.failed_precondition(
                        f"hardware version {vm.hardware_version} cannot go down to {target}"
                    )
                )
            vm.hardware_version = target
            return Success(None)

    # --- PowerControl -------------------------------------------------------------------------

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]:
        with self._operation("power_state") as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.get(vm_id)
            if vm is None:
                return Failure(ProviderError.vm_not_found(vm_id))
            return Success(PowerState.ON if self._running(vm) else PowerState.OFF)

    def power_on(self, vm_id: str) -> Result[None, ProviderError]:
        return self._mutate("power_on", vm_id, self._start)

    def power_off(self, vm_id: str) -> Result[None, ProviderError]:
        return self._mutate("power_off", vm_id, self._stop)

    def reboot(self, vm_id: str) -> Result[None, ProviderError]:
        def reboot(vm: _VM) -> None:
            self._stop(vm)
            self._start(vm)

        return self._mutate("reboot", vm_id, reboot)

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        def request(vm: _VM) -> None:
            if self._running(vm) and self.guest_honors_shutdown:
                vm.shutdown_requested_at = self._clock.now()
            vm.shutdown_deadline = deadline

        return self._mutate("request_shutdown", vm_id, request)

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        with self._operation("shutdown_deadline") as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.get(vm_id)
            if vm is None:
                return Failure(ProviderError.vm_not_found(vm_id))
            return Success(vm.shutdown_deadline)

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:
        def clear(vm: _VM) -> None:
            vm.shutdown_deadline = None

        return self._mutate("clear_shutdown_deadline", vm_id, clear)

    # --- Inventory ----------------------------------------------------------------------------

    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        with self._operation("describe") as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.get(vm_id)
            if vm is None:
                return Success(None)
            running = self._running(vm)
            return Success(
                VMDescription(
                    power_state=PowerState.ON if running else PowerState.OFF,
                    ips=self._guest_addresses(vm, running),
                    console_url=f"vnc://127.0.0.1:{5900 + int(vm.id[-4:], 16) % 1000}"
                    if running
                    else "",
                    raw=self._raw(vm),
                )
            )

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        with self._operation("vm_info") as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.get(vm_id)
            return Success(None if vm is None else self._info(vm))

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        with self._operation("list_vms") as failed:
            if failed:
                return Failure(failed[0])
            return Success([self._info(vm) for vm in self._vms.values()])

    # --- Snapshots ----------------------------------------------------------------------------

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        with self._operation("create_snapshot") as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.get(request.vm_id)
            if vm is None:
                return Failure(ProviderError.vm_not_found(request.vm_id))
            existing = vm.snapshots.get(request.name)
            if existing is not None:
                return Success(existing.snapshot)  # a retried request: the same snapshot
            running = self._running(vm)
            snapshot = Snapshot(
                id=request.name,
                name=request.name,
                description=request.description,
                include_memory=request.include_memory and running,
            )
            vm.snapshots[snapshot.id] = _SnapshotState(
                snapshot=snapshot,
                cpu=vm.cpu,
                memory_mib=vm.memory_mib,
                disk_sizes=[disk.size_gib for disk in vm.disks],
                running=snapshot.include_memory,
            )
            return Success(snapshot)

    def delete_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        with self._operation("delete_snapshot") as failed:
            if failed:
                return Failure(failed[0])
            found = self._snapshot(vm_id, snapshot_id)
            if isinstance(found, ProviderError):
                return Failure(found)
            del self._vms[vm_id].snapshots[snapshot_id]
            return Success(None)

    def revert_snapshot(self, vm_id: str, snapshot_id: str) -> Result[None, ProviderError]:
        with self._operation("revert_snapshot") as failed:
            if failed:
                return Failure(failed[0])
            found = self._snapshot(vm_id, snapshot_id)
            if isinstance(found, ProviderError):
                return Failure(found)
            vm = self._vms[vm_id]
            vm.cpu, vm.memory_mib = found.cpu, found.memory_mib
            for disk, size in zip(vm.disks, found.disk_sizes, strict=False):
                disk.size_gib = size
            del vm.disks[len(found.disk_sizes) :]
            if found.running:
                self._start(vm)
            else:
                self._stop(vm)
            return Success(None)

    # --- Cloning ------------------------------------------------------------------------------

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """Made within the call: no task."""
        return self.clone(request, owner).map(lambda vm_id: CreatedVM(id=vm_id))

    def clone(self, request: CloneRequest, owner: OwnerMark) -> Result[str, ProviderError]:
        with self._operation("clone") as failed:
            if failed:
                return Failure(failed[0])
            source = self._vms.get(request.source_vm_id)
            if source is None:
                return Failure(ProviderError.vm_not_found(request.source_vm_id))
            existing = self._ids_by_name.get(request.target_name)
            if existing is not None:
                return self._adopt(existing, owner)
            disks = [
                _Disk(
                    id=f"disk{index}",
                    path=f"{DISK_DIR}/{request.target_name}-disk{index}.qcow2",
                    size_gib=disk.size_gib,
                    format="qcow2",
                    backing_file=disk.path if request.linked else "",
                )
                for index, disk in enumerate(source.disks)
            ]
            customization = request.customization
            nics = (
                [self._nic(attachment) for attachment in customization.networks]
                if customization and customization.networks
                else [_Nic(name=nic.name, mac=self._mac()) for nic in source.nics]
            )
            vm = self._new_vm(
                request.target_name,
                owner,
                cpu=request.cpu or source.cpu,
                memory_mib=request.memory_mib or source.memory_mib,
                disks=disks,
                nics=nics,
            )
            vm.firmware, vm.hardware_version = source.firmware, source.hardware_version
            vm.cpu_hot_add, vm.memory_hot_add = source.cpu_hot_add, source.memory_hot_add
            vm.hostname = customization.hostname if customization else ""
            return Success(vm.id)

    # --- Images -------------------------------------------------------------------------------

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        with self._operation("prepare_image") as failed:
            if failed:
                return Failure(failed[0])
            path = f"{IMAGE_DIR}/{request.target_name}.qcow2"
            prepared = self._images.get(path)
            if prepared is None:
                source = request.source
                if source.template_name:
                    template = self._templates.get(source.template_name)
                    if template is None:
                        return Failure(_no_such("image_json.templateName", source.template_name))
                    size = template.size_gib
                elif source.path:
                    base = self._images.get(source.path)
                    if base is None:
                        return Failure(_no_such("image_json.path", source.path))
                    size = base.size_gib
                elif source.url.startswith(("http://", "https://")):
                    size = 2
                else:
                    return Failure(
                        ProviderError.invalid_spec("image_json.url", "must be an http(s) URL")
                    )
                prepared = _Image(id=request.target_name, path=path, size_gib=size)
                self._images[path] = prepared
            return Success(PreparedImage(id=prepared.id, path=prepared.path))

    # --- DiskTransfer -------------------------------------------------------------------------

    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        with self._operation("export_disk") as failed:
            if failed:
                return Failure(failed[0])
            disk = self._disk(request.vm_id, request.disk_id, request.snapshot_id)
            if isinstance(disk, ProviderError):
                return Failure(disk)
            export_id = f"export-{uuid.uuid4().hex[:12]}"
            self._exports.add(export_id)
            return Success(
                ExportResult(export_id=export_id, estimated_size_bytes=disk.size_gib * GIB)
            )

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        with self._operation("import_disk") as failed:
            if failed:
                return Failure(failed[0])
            name = request.target_name or f"imported-{next(self._counter)}"
            disk = _Disk(
                id=name,
                path=f"{DISK_DIR}/{name}.{request.format}",
                size_gib=1,
                format=request.format,
            )
            self._loose_disks[disk.id] = disk
            return Success(
                ImportResult(
                    disk_id=disk.id,
                    path=disk.path,
                    actual_size_bytes=disk.size_gib * GIB,
                    checksum=request.expected_checksum,
                )
            )

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        with self._operation("disk_details") as failed:
            if failed:
                return Failure(failed[0])
            disk = self._disk(query.vm_id, query.disk_id, query.snapshot_id)
            if isinstance(disk, ProviderError):
                return Failure(disk)
            vm = self._vms[query.vm_id]
            return Success(
                DiskDetails(
                    disk_id=disk.id,
                    format=disk.format,
                    virtual_size_bytes=disk.size_gib * GIB,
                    actual_size_bytes=disk.size_gib * GIB // 10,
                    path=disk.path,
                    is_bootable=disk.id == vm.disks[0].id,
                    snapshots=tuple(vm.snapshots),
                    backing_file=disk.backing_file,
                    metadata={"vm": vm.name},
                )
            )

    # --- Health, CapabilitySource, TaskTracker ------------------------------------------------

    def check(self) -> HealthReport:
        failure = self.faults.before("check")
        if isinstance(failure, Failure):
            return HealthReport(ok=False, message=failure.failure().message)
        return HealthReport(ok=True, message="fake hypervisor reachable")

    def capabilities(self) -> Capabilities:
        return self._capabilities

    def task_state(self, task_id: str) -> TaskState | None:
        """Every fake operation completes synchronously: it issues no task ids."""
        return None

    # --- internals ----------------------------------------------------------------------------

    @contextmanager
    def _operation(self, name: str) -> Iterator[list[ProviderError]]:
        """Serve injected latency outside the lock, then hold the lock for the state change.

        Yields [error] when a failure was injected for `name`, else [].
        """
        injected = self.faults.before(name)
        with self._lock:
            yield [injected.failure()] if isinstance(injected, Failure) else []

    def _mutate(
        self, operation: str, vm_id: str, change: Callable[[_VM], None]
    ) -> Result[None, ProviderError]:
        with self._operation(operation) as failed:
            if failed:
                return Failure(failed[0])
            vm = self._vms.get(vm_id)
            if vm is None:
                return Failure(ProviderError.vm_not_found(vm_id))
            change(vm)
            return Success(None)

    @staticmethod
    def _record(vm: _VM) -> VMRecord:
        return VMRecord(id=vm.id, name=vm.name, owner=vm.owner, building_since=vm.building_since)

    def _adopt(self, vm_id: str, owner: OwnerMark) -> Result[str, ProviderError]:
        vm = self._vms[vm_id]
        if vm.owner == owner:
            return Success(vm.id)
        return Failure(
            ProviderError.already_exists(f"a VM named {vm.name!r} exists and is not ours")
        )

    def _new_vm(
        self,
        name: str,
        owner: OwnerMark | None,
        *,
        cpu: int,
        memory_mib: int,
        disks: list[_Disk],
        nics: list[_Nic],
    ) -> _VM:
        vm = _VM(
            id=str(uuid.uuid4()),
            name=name,
            owner=owner,
            cpu=cpu,
            memory_mib=memory_mib,
            disks=disks,
            nics=nics,
        )
        self._vms[vm.id] = vm
        self._ids_by_name[name] = vm.id
        return vm

    def _root_disk(self, request: CreateRequest) -> _Disk | ProviderError:
        image = request.image
        wanted = request.vm_class.disk_defaults.size_gib
        path = f"{DISK_DIR}/{request.name}-disk0.qcow2"
        if image.is_blank:
            return _Disk(id="disk0", path=path, size_gib=wanted or DEFAULT_ROOT_DISK_GIB)
        if image.template_name:
            template = self._templates.get(image.template_name)
            if template is None:
                return _no_such("image_json.TemplateName", image.template_name)
            return _Disk(id="disk0", path=path, size_gib=max(wanted, template.size_gib))
        if image.path:
            base = self._images.get(image.path)
            if base is None:
                return _no_such("image_json.Path", image.path)
            size = max(wanted, base.size_gib)
            return _Disk(id="disk0", path=path, size_gib=size, backing_file=base.path)
        if not image.url.startswith(("http://", "https://")):
            return ProviderError.invalid_spec("image_json.URL", "must be an http(s) URL")
        return _Disk(id="disk0", path=path, size_gib=wanted or DEFAULT_ROOT_DISK_GIB)

    def _blank_disk(self, vm_name: str, index: int, size_gib: int) -> _Disk:
        return _Disk(
            id=f"disk{index}", path=f"{DISK_DIR}/{vm_name}-disk{index}.qcow2", size_gib=size_gib
        )

    def _nic(self, attachment: NetworkAttachment) -> _Nic:
        name = (
            attachment.network_name
            or attachment.bridge
            or attachment.portgroup
            or attachment.name
            or "user"
        )
        return _Nic(name=name, mac=attachment.mac_address or self._mac())

    def _mac(self) -> str:
        serial = next(self._counter)
        return (
            f"52:54:00:{(serial >> 16) & 0xFF:02x}:{(serial >> 8) & 0xFF:02x}:{serial & 0xFF:02x}"
        )

    def _running(self, vm: _VM) -> bool:
        """Settle a requested guest shutdown whose time has come, then answer."""
        requested = vm.shutdown_requested_at
        due = (
            requested is not None and self._clock.now() >= requested + self._guest_shutdown_seconds
        )
        if vm.running and due:
            vm.running = False
            vm.shutdown_requested_at = None
        return vm.running and not vm.paused

    def _start(self, vm: _VM) -> None:
        if not self._running(vm):
            vm.running, vm.paused = True, False
            vm.started_at = self._clock.now()
            vm.pending_restart = False
        vm.shutdown_requested_at = None

    def _stop(self, vm: _VM) -> None:
        vm.running = vm.paused = False
        vm.shutdown_requested_at = None

    def _guest_addresses(self, vm: _VM, running: bool) -> tuple[str, ...]:
        """What a guest agent reports: loopback and link-local included, as real ones do."""
        if not running or self._clock.now() < vm.started_at + self._ip_delay:
            return ()
        serial = int(vm.id[:6], 16)
        addresses = ["127.0.0.1", "::1", "fe80::5054:ff:fe00:1"]
        for index, _ in enumerate(vm.nics or [_Nic(name="user", mac="")]):
            addresses.append(f"198.51.100.{(serial + index) % 250 + 2}")
        return tuple(addresses)

    def _raw(self, vm: _VM) -> dict[str, str]:
        return {
            "id": vm.id,
            "name": vm.name,
            "state": "paused" if vm.paused else "running" if vm.running else "shut off",
            "cpu": str(vm.cpu),
            "memory_mib": str(vm.memory_mib),
            "firmware": vm.firmware,
            "hardware_version": str(vm.hardware_version),
            "pending_restart": "true" if vm.pending_restart else "false",
            "hostname": vm.hostname,
        }

    def _info(self, vm: _VM) -> VMInfo:
        running = self._running(vm)
        addresses = self._guest_addresses(vm, running)
        routable = routable_addresses(addresses)
        return VMInfo(
            id=vm.id,
            name=vm.name,
            power_state=PowerState.ON if running else PowerState.OFF,
            ips=addresses,
            cpu=vm.cpu,
            memory_mib=vm.memory_mib,
            disks=tuple(
                DiskInfo(id=disk.id, path=disk.path, size_gib=disk.size_gib, format=disk.format)
                for disk in vm.disks
            ),
            networks=tuple(
                NetworkInfo(
                    name=nic.name,
                    mac=nic.mac,
                    ip_address=routable[index] if index < len(routable) else "",
                )
                for index, nic in enumerate(vm.nics)
            ),
            provider_raw=self._raw(vm),
        )

    def _snapshot(self, vm_id: str, snapshot_id: str) -> _SnapshotState | ProviderError:
        vm = self._vms.get(vm_id)
        if vm is None:
            return ProviderError.vm_not_found(vm_id)
        found = vm.snapshots.get(snapshot_id)
        if found is None:
            return ProviderError.not_found(f"VM {vm.name!r} has no snapshot {snapshot_id!r}")
        return found

    def _disk(self, vm_id: str, disk_id: str, snapshot_id: str) -> _Disk | ProviderError:
        vm = self._vms.get(vm_id)
        if vm is None:
            return ProviderError.vm_not_found(vm_id)
        if snapshot_id and snapshot_id not in vm.snapshots:
            return ProviderError.not_found(f"VM {vm.name!r} has no snapshot {snapshot_id!r}")
        if not disk_id:
            if not vm.disks:
                return ProviderError.not_found(f"VM {vm.name!r} has no disks")
            return copy.copy(vm.disks[0])
        for disk in vm.disks:
            if disk_id in (disk.id, disk.path):
                return copy.copy(disk)
        return ProviderError.not_found(f"VM {vm.name!r} has no disk {disk_id!r}")


def _no_such(field: str, name: str) -> ProviderError:
    return ProviderError.invalid_spec(field, f"{name!r} does not exist on this hypervisor")
