"""Hypervisor call metrics: every port method call counted and timed, by operation.

The container wraps each port of the selected backend here before wiring the use cases, so
every port is instrumented without the adapters knowing it, and the use cases reach an
adapter through an application frame only (the metrics themselves are a port,
`ports/call_metrics.py`, which the provider's Prometheus metrics implement).
One wrapper class per port implements its protocol, each method timing the call it hands on;
the operation label is the port method's name (`describe`, `start_create`, ...). What a
disk port hands back to be driven further (a disk stream, a landing site and the disk it
received) is wrapped likewise, so its calls are timed too (`read_chunk`, `receive`, ...).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import (
    CapabilitySource,
    Cloning,
    DiskTransfer,
    Health,
    Images,
    Inventory,
    PowerControl,
    Snapshots,
    TaskTracker,
    VMLifecycle,
)
from pyrigaud.application.ports.call_metrics import CallMetrics
from pyrigaud.application.ports.disk_transfer import (
    DiskStream,
    LandingSite,
    ReceivedDisk,
    TransferLeftovers,
    TransferWatch,
)
from pyrigaud.application.ports.virtual_hardware import HardwareFacts
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.disk_images import JudgedImage, LandedDisk, LeftBehind
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import VirtualHardware
from pyrigaud.domain.models import (
    Capabilities,
    CloneRequest,
    CreateRequest,
    DiskDetails,
    DiskQuery,
    DiskRead,
    HealthReport,
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
from pyrigaud.domain.tasks import TaskRef, TaskState

_Value = TypeVar("_Value")


def instrument_backend(backend: Backend, metrics: CallMetrics) -> Backend:
    """`backend` with each port it has wrapped in its timed counterpart; a missing port stays
    None. The operations of the ports it has are counted (at 0) from the start."""
    timer = Timer(metrics)
    timed = Backend(
        lifecycle=TimedLifecycle(backend.lifecycle, timer),
        power=TimedPower(backend.power, timer),
        inventory=TimedInventory(backend.inventory, timer),
        health=TimedHealth(backend.health, timer),
        capabilities=TimedCapabilities(backend.capabilities, timer),
        tasks=TimedTasks(backend.tasks, timer),
        snapshots=_optional(TimedSnapshots, backend.snapshots, timer),
        cloning=_optional(TimedCloning, backend.cloning, timer),
        images=_optional(TimedImages, backend.images, timer),
        disk_transfer=_optional(TimedDiskTransfer, backend.disk_transfer, timer),
        transfer_leftovers=_optional(TimedLeftovers, backend.transfer_leftovers, timer),
        hardware=_optional(TimedHardware, backend.hardware, timer),
    )
    metrics.expect_hypervisor_calls(_operations_of(timed))
    return timed


def _optional(
    wrapper: Callable[[_Value, Timer], _Value], port: _Value | None, timer: Timer
) -> _Value | None:
    return None if port is None else wrapper(port, timer)


def _operations_of(backend: Backend) -> Iterator[str]:
    """The operations each timed port of `backend` records: its wrapper's public methods."""
    for field in dataclasses.fields(backend):
        port = getattr(backend, field.name)
        if port is not None:
            yield from _operations_of_wrapper(type(port))


def _operations_of_wrapper(wrapper: type) -> Iterator[str]:
    for name, member in vars(wrapper).items():
        if not name.startswith("_") and callable(member):
            yield name
    for inner in _HANDS_BACK.get(wrapper, ()):
        yield from _operations_of_wrapper(inner)


def _call_outcome(value: object) -> str:
    """ "ok", or what went wrong: the error kind of a Failure, "unavailable" for a bad check."""
    match value:
        case Failure(ProviderError() as error):
            return error.kind.value
        case HealthReport(ok=False):
            return "unavailable"
    return "ok"


class Timer:
    """Times calls of port methods and records each under its operation's name."""

    def __init__(self, metrics: CallMetrics) -> None:
        self._record = metrics.record_hypervisor_call

    def __call__(self, operation: str) -> TimedCall:
        """One call's timing, as the block the call runs in (a `with` adds no frame while the
        port works, as a wrapper around the call would)."""
        return TimedCall(self._record, operation)


class TimedCall:
    """One timed call: started now, recorded when its block ends, with the outcome `told` of
    the value it answered ("ok" when none is told), or "exception" when it raised one."""

    __slots__ = ("_operation", "_outcome", "_record", "_started")

    def __init__(self, record: Callable[[str, str, float], None], operation: str) -> None:
        self._record = record
        self._operation = operation
        self._outcome = "ok"
        self._started = time.perf_counter()

    def __enter__(self) -> TimedCall:
        return self

    def told(self, value: _Value) -> _Value:
        """`value`, its outcome noted for the record."""
        match value:  # a Success, the common case, told without a call (an exact-type hit)
            case Success():
                self._outcome = "ok"
            case _:
                self._outcome = _call_outcome(value)
        return value

    def __exit__(self, kind: type[BaseException] | None, _error: object, _trace: object) -> None:
        if kind is None:
            self._record(self._operation, self._outcome, time.perf_counter() - self._started)
        elif issubclass(kind, Exception):
            self._record(self._operation, "exception", time.perf_counter() - self._started)


class TimedLifecycle:
    def __init__(self, port: VMLifecycle, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        with self._timer("find_by_name") as timed:
            return timed.told(self._port.find_by_name(name))

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        with self._timer("find_unfinished") as timed:
            return timed.told(self._port.find_unfinished())

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        with self._timer("start_create") as timed:
            return timed.told(self._port.start_create(request, owner))

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        with self._timer("delete") as timed:
            return timed.told(self._port.delete(vm_id))

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[TaskRef | None, ProviderError]:
        with self._timer("reconfigure") as timed:
            return timed.told(self._port.reconfigure(vm_id, changes))

    def upgrade_hardware(
        self, vm_id: str, target_version: int
    ) -> Result[TaskRef | None, ProviderError]:
        with self._timer("upgrade_hardware") as timed:
            return timed.told(self._port.upgrade_hardware(vm_id, target_version))


class TimedPower:
    def __init__(self, port: PowerControl, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]:
        with self._timer("power_state") as timed:
            return timed.told(self._port.power_state(vm_id))

    def power_on(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        with self._timer("power_on") as timed:
            return timed.told(self._port.power_on(vm_id))

    def power_off(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        with self._timer("power_off") as timed:
            return timed.told(self._port.power_off(vm_id))

    def reboot(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        with self._timer("reboot") as timed:
            return timed.told(self._port.reboot(vm_id))

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        with self._timer("request_shutdown") as timed:
            return timed.told(self._port.request_shutdown(vm_id, deadline))

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        with self._timer("shutdown_deadline") as timed:
            return timed.told(self._port.shutdown_deadline(vm_id))

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:
        with self._timer("clear_shutdown_deadline") as timed:
            return timed.told(self._port.clear_shutdown_deadline(vm_id))


class TimedInventory:
    def __init__(self, port: Inventory, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        with self._timer("describe") as timed:
            return timed.told(self._port.describe(vm_id))

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        with self._timer("vm_info") as timed:
            return timed.told(self._port.vm_info(vm_id))

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        with self._timer("list_vms") as timed:
            return timed.told(self._port.list_vms())


class TimedHealth:
    def __init__(self, port: Health, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def check(self) -> HealthReport:
        with self._timer("check") as timed:
            return timed.told(self._port.check())


class TimedCapabilities:
    def __init__(self, port: CapabilitySource, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def capabilities(self) -> Capabilities:
        with self._timer("capabilities") as timed:
            return timed.told(self._port.capabilities())


class TimedTasks:
    def __init__(self, port: TaskTracker, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def task_state(self, task_id: str) -> TaskState | None:
        with self._timer("task_state") as timed:
            return timed.told(self._port.task_state(task_id))


class TimedSnapshots:
    def __init__(self, port: Snapshots, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        with self._timer("create_snapshot") as timed:
            return timed.told(self._port.create_snapshot(request))

    def delete_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:
        with self._timer("delete_snapshot") as timed:
            return timed.told(self._port.delete_snapshot(vm_id, snapshot_id))

    def revert_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:
        with self._timer("revert_snapshot") as timed:
            return timed.told(self._port.revert_snapshot(vm_id, snapshot_id))


class TimedCloning:
    def __init__(self, port: Cloning, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        with self._timer("start_clone") as timed:
            return timed.told(self._port.start_clone(request, owner))


class TimedImages:
    def __init__(self, port: Images, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        with self._timer("prepare_image") as timed:
            return timed.told(self._port.prepare_image(request))


class TimedLeftovers:
    def __init__(self, port: TransferLeftovers, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def sweep_transfer_leftovers(
        self, older_than_seconds: float
    ) -> Result[tuple[str, ...], ProviderError]:
        sweep = self._port.sweep_transfer_leftovers
        with self._timer("sweep_transfer_leftovers") as timed:
            return timed.told(sweep(older_than_seconds))


class TimedHardware:
    def __init__(self, port: HardwareFacts, timer: Timer) -> None:
        self._port, self._timer = port, timer

    def hardware_of(self, vm_id: str, disk_id: str) -> Result[VirtualHardware, ProviderError]:
        with self._timer("hardware_of") as timed:
            return timed.told(self._port.hardware_of(vm_id, disk_id))

    def import_record_of(self, disk_path: str) -> Result[bytes | None, ProviderError]:
        with self._timer("import_record_of") as timed:
            return timed.told(self._port.import_record_of(disk_path))


class TimedDiskTransfer:
    """The disk port; the stream it reads and the site it lands on are timed as well."""

    def __init__(self, port: DiskTransfer, timer: Timer) -> None:
        self._port, self._timer = port, timer

    @property
    def disk_suffix(self) -> str:
        return self._port.disk_suffix

    def read_disk(self, disk: DiskRead, watch: TransferWatch) -> Result[DiskStream, ProviderError]:
        with self._timer("read_disk") as timed:
            return timed.told(self._port.read_disk(disk, watch)).map(self._stream)

    def landing_site(self, stem: str, storage_hint: str) -> Result[LandingSite, ProviderError]:
        with self._timer("landing_site") as timed:
            site = timed.told(self._port.landing_site(stem, storage_hint))
        return site.map(self._site)

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        with self._timer("disk_details") as timed:
            return timed.told(self._port.disk_details(query))

    def _stream(self, stream: DiskStream) -> DiskStream:
        return TimedDiskStream(stream, self._timer)

    def _site(self, site: LandingSite) -> LandingSite:
        return TimedLandingSite(site, self._timer)


class TimedDiskStream:
    def __init__(self, stream: DiskStream, timer: Timer) -> None:
        self._stream, self._timer = stream, timer

    @property
    def size_bytes(self) -> int | None:
        return self._stream.size_bytes

    @property
    def left_behind(self) -> tuple[LeftBehind, ...]:
        return self._stream.left_behind

    @property
    def made_whole_first(self) -> bool:
        return self._stream.made_whole_first

    def make(self, into: BinaryIO | None) -> Result[None, ProviderError]:
        with self._timer("make") as timed:
            return timed.told(self._stream.make(into))

    def read_chunk(self) -> Result[bytes, ProviderError]:
        with self._timer("read_chunk") as timed:
            return timed.told(self._stream.read_chunk())

    def close(self) -> None:
        with self._timer("close"):
            self._stream.close()


class TimedLandingSite:
    def __init__(self, site: LandingSite, timer: Timer) -> None:
        self._site, self._timer = site, timer

    @property
    def disk_name(self) -> str:
        return self._site.disk_name

    @property
    def place(self) -> str:
        return self._site.place

    def earlier_record(self) -> Result[bytes | None, ProviderError]:
        with self._timer("earlier_record") as timed:
            return timed.told(self._site.earlier_record())

    def receive(
        self,
        chunks: Iterable[bytes],
        size_bytes: int | None,
        image: JudgedImage,
        watch: TransferWatch,
    ) -> Result[ReceivedDisk, ProviderError]:
        with self._timer("receive") as timed:
            received = timed.told(self._site.receive(chunks, size_bytes, image, watch))
        return received.map(self._received)

    def keep_record(self, record: bytes, landed: LandedDisk) -> Result[None, ProviderError]:
        with self._timer("keep_record") as timed:
            return timed.told(self._site.keep_record(record, landed))

    def _received(self, disk: ReceivedDisk) -> ReceivedDisk:
        return TimedReceivedDisk(disk, self._timer)


class TimedReceivedDisk:
    def __init__(self, disk: ReceivedDisk, timer: Timer) -> None:
        self._disk, self._timer = disk, timer

    def land(self) -> Result[LandedDisk, ProviderError]:
        with self._timer("land") as timed:
            return timed.told(self._disk.land())

    def discard(self) -> None:
        with self._timer("discard"):
            self._disk.discard()


# What a wrapper's calls hand back wrapped in further timed wrappers: their operations too.
_HANDS_BACK: dict[type, tuple[type, ...]] = {
    TimedDiskTransfer: (TimedDiskStream, TimedLandingSite),
    TimedLandingSite: (TimedReceivedDisk,),
}
