"""The in-memory hypervisor's state: its VMs, images and clock, for unit tests and the demo server.

The ports are served by one module each over this state (`backend.fake_backend` puts them
together). New VMs start powered off; guests get an address once running; a graceful shutdown
completes after `guest_shutdown_seconds` unless the guest is made to ignore it. All state sits
behind one lock, and injected latency is served outside it, so a slow Create never stalls
Describe. Latency is wall time (the demo server's, the e2e tests' races), waited out on a clock
of its own: a test's manual clock would make it vanish.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.fake.faults import FakeFaults
from pyrigaud.application.ports import Clock
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import DiskController, NicModel
from pyrigaud.domain.models import (
    Capabilities,
    NetworkAttachment,
    OwnerMark,
    Snapshot,
)

T = TypeVar("T")

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
    supports_clone=True,
    supports_hardware_upgrade=True,
)


@dataclass
class FakeDisk:
    id: str
    path: str
    size_gib: int
    format: str = "qcow2"
    backing_file: str = ""


@dataclass
class FakeNic:
    name: str
    mac: str
    model: NicModel | None = NicModel.VIRTIO


@dataclass
class FakeSnapshot:
    """A snapshot and the configuration a revert restores."""

    snapshot: Snapshot
    cpu: int
    memory_mib: int
    disk_sizes: list[int]
    running: bool


@dataclass
class FakeVM:
    id: str
    name: str
    owner: OwnerMark | None
    cpu: int
    memory_mib: int
    disks: list[FakeDisk]
    nics: list[FakeNic]
    cpu_hot_add: bool = False
    memory_hot_add: bool = False
    firmware: str = "BIOS"
    secure_boot: bool = False
    # What its guest reaches its root disk through: virtio unless Create was told the guest's.
    disk_controller: DiskController | None = DiskController.VIRTIO_BLK
    running: bool = False
    paused: bool = False
    shutdown_requested_at: float | None = None
    shutdown_deadline: int | None = None
    pending_restart: bool = False
    hardware_version: int = 19
    tags: tuple[str, ...] = ()
    hostname: str = ""
    building_since: float | None = None
    snapshots: dict[str, FakeSnapshot] = field(default_factory=dict)


@dataclass
class FakeImage:
    id: str
    path: str
    size_gib: int
    format: str = "qcow2"


class FakeHypervisor:
    """Thread-safe state; the port modules read and change it only inside `serve`.

    The test hooks are public: add_image, add_foreign_vm, add_unfinished_vm, finish_building,
    pause, `faults` (failures and latency per operation) and `guest_honors_shutdown`.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        capabilities: Capabilities = FAKE_CAPABILITIES,
        datastores: tuple[str, ...] = ("default",),
        guest_shutdown_seconds: float = 0.0,
        latency: Mapping[str, float] | None = None,
        latency_clock: Clock | None = None,
    ) -> None:
        self.faults = FakeFaults(latency_clock or SystemClock())
        for operation, seconds in (latency or {}).items():
            self.faults.slow(operation, seconds)
        self.guest_honors_shutdown = True
        self.clock = clock
        self.capabilities = capabilities
        self.datastores = datastores
        self.guest_shutdown_seconds = guest_shutdown_seconds
        self.vms: dict[str, FakeVM] = {}
        self.ids_by_name: dict[str, str] = {}
        self.images: dict[str, FakeImage] = {}  # by path
        # Disk imports: what each landed disk holds, and the record kept beside it, by name.
        self.imported: dict[str, bytes] = {}
        self.import_records: dict[str, bytes] = {}
        self._lock = threading.RLock()
        self._serials = itertools.count(1)

    # --- test hooks ---------------------------------------------------------------------------

    def add_image(self, path: str, size_gib: int = 2, disk_format: str = "qcow2") -> None:
        """A base image file that exists on the "host" (as if an operator put it there)."""
        with self._lock:
            self.images[path] = FakeImage(id=path, path=path, size_gib=size_gib, format=disk_format)

    def add_foreign_vm(self, name: str, owner: OwnerMark | None = None) -> str:
        """A VM someone else made (no ownership mark, or another provider's)."""
        with self._lock:
            return self.new_vm(name, owner, cpu=1, memory_mib=512, disks=[], nics=[]).id

    def add_unfinished_vm(self, name: str, owner: OwnerMark, building_since: float) -> str:
        """A VM as a Create killed part-way leaves it: still marked as building."""
        with self._lock:
            vm = self.new_vm(name, owner, cpu=1, memory_mib=512, disks=[], nics=[])
            vm.building_since = building_since
            return vm.id

    def finish_building(self, vm_id: str) -> None:
        """What another replica's Create does when it completes."""
        with self._lock:
            self.vms[vm_id].building_since = None

    def pause(self, vm_id: str) -> None:
        with self._lock:
            self.vms[vm_id].paused = True

    # --- what the port modules share ----------------------------------------------------------

    def serve(
        self, operation: str, work: Callable[[], Result[T, ProviderError]]
    ) -> Result[T, ProviderError]:
        """Serve `operation`'s injected latency and failure outside the lock, then do `work`
        under it."""
        # Success first: a class pattern that matches the exact type makes no call into the
        # ABC metaclass's isinstance, a Python frame on every Describe.
        match self.faults.before(operation):
            case Success():
                with self._lock:
                    return work()
            case Failure() as failed:
                return failed
        raise TypeError("faults.before answers a Result")

    def vm(self, vm_id: str) -> Result[FakeVM, ProviderError]:
        found = self.vms.get(vm_id)
        if found is None:
            return Failure(ProviderError.vm_not_found(vm_id))
        return Success(found)

    def new_vm(
        self,
        name: str,
        owner: OwnerMark | None,
        *,
        cpu: int,
        memory_mib: int,
        disks: list[FakeDisk],
        nics: list[FakeNic],
    ) -> FakeVM:
        """A VM under `name`, which the caller has checked is free."""
        vm = FakeVM(
            id=str(uuid.uuid4()),
            name=name,
            owner=owner,
            cpu=cpu,
            memory_mib=memory_mib,
            disks=disks,
            nics=nics,
        )
        self.vms[vm.id] = vm
        self.ids_by_name[name] = vm.id
        return vm

    def require_free_name(self, name: str) -> Result[None, ProviderError]:
        """A hypervisor refuses a second VM of one name, whoever made the first."""
        if name in self.ids_by_name:
            return Failure(ProviderError.already_exists(f"a VM named {name!r} already exists"))
        return Success(None)

    def next_serial(self) -> int:
        return next(self._serials)

    def nic(self, attachment: NetworkAttachment) -> FakeNic:
        name = (
            attachment.network_name
            or attachment.bridge
            or attachment.portgroup
            or attachment.name
            or "user"
        )
        return FakeNic(name=name, mac=attachment.mac_address or self.mac())

    def mac(self) -> str:
        serial = self.next_serial()
        return (
            f"52:54:00:{(serial >> 16) & 0xFF:02x}:{(serial >> 8) & 0xFF:02x}:{serial & 0xFF:02x}"
        )

    def running(self, vm: FakeVM) -> bool:
        """Settle a requested guest shutdown whose time has come, then answer."""
        requested = vm.shutdown_requested_at
        due = requested is not None and self.clock.now() >= requested + self.guest_shutdown_seconds
        if vm.running and due:
            vm.running = False
            vm.shutdown_requested_at = None
        return vm.running and not vm.paused

    def start(self, vm: FakeVM) -> None:
        if not self.running(vm):
            vm.running, vm.paused = True, False
            vm.pending_restart = False
        vm.shutdown_requested_at = None

    @staticmethod
    def stop(vm: FakeVM) -> None:
        vm.running = vm.paused = False
        vm.shutdown_requested_at = None


def not_on_this_host(field: str, name: str) -> Failure[ProviderError]:
    """A request naming an image the fake host does not have."""
    return Failure(ProviderError.invalid_spec(field, f"{name!r} does not exist on this hypervisor"))


def no_templates(field: str) -> Failure[ProviderError]:
    """A request naming a template: the fake host keeps images by path only."""
    return Failure(
        ProviderError.invalid_spec(field, "the fake hypervisor has no templates; give a path")
    )
