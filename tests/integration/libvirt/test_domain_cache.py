"""The event-kept domain cache behind Describe and ListVMs, on libvirt's test driver.

All `test:///default` connections of one process share one host, so a second connection is
another replica (or virsh) writing to the same libvirt. Events reach the backend on libvirt's
event thread; a test that waits for one polls Describe until it changes (bounded, never timed).
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import (
    LibvirtConnection,
    prepare_libvirt_for_process,
)
from pyrigaud.adapters.hypervisors.libvirt.domain_cache import DomainCache, read_view
from pyrigaud.adapters.hypervisors.libvirt.guest import power_of
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    OwnerMark,
    SnapshotRequest,
    VMChanges,
    VMClass,
    VMDescription,
)
from pyrigaud.domain.power import PowerState

from support import ManualClock, error_kind, ok, present
from support.libvirt import clone_vm, create_vm, libvirt_test_backend

URI = "test:///default"
OWNER = OwnerMark(provider="tests/domain-cache")
PREFIX = "cache-"
MARKER_DOMAIN = "test"  # test:///default's own domain, for settle()
EVENT_WAIT_SECONDS = 30.0
ALL_EVENTS = (
    libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
    libvirt.VIR_DOMAIN_EVENT_ID_METADATA_CHANGE,
    libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_ADDED,
    libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
    libvirt.VIR_DOMAIN_EVENT_ID_TUNABLE,
    libvirt.VIR_DOMAIN_EVENT_ID_REBOOT,
)


class EventGate:
    """Holds libvirt's (single) event thread inside a callback while closed.

    Registered before the backend subscribes, its callbacks run first for every event, so
    while the gate is closed no event reaches the backend: what it then shows of its own
    writes can only come from the writes themselves. Events are delivered in order, so once
    the gate sees a marker event, the backend has heard every event before it (`settle`).
    """

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._open = threading.Event()
        self._open.set()
        self._markers = threading.Semaphore(0)
        for event in ALL_EVENTS:
            conn.domainEventRegisterAny(None, event, self._hold, None)

    def _hold(self, _conn: Any, dom: Any, *_: object) -> None:
        if dom.name() == MARKER_DOMAIN:
            self._markers.release()
        self._open.wait(EVENT_WAIT_SECONDS)  # bounded: a failed test never hangs the loop

    def settle(self) -> None:
        """Until every event so far has reached the backend."""
        marker = self._conn.lookupByName(MARKER_DOMAIN)
        marker.setMetadata(libvirt.VIR_DOMAIN_METADATA_DESCRIPTION, "marker", None, None, 0)
        assert self._markers.acquire(timeout=EVENT_WAIT_SECONDS), "no event came"

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()


@pytest.fixture
def other() -> Iterator[Any]:
    """Another writer on the same host: a second connection to test:///default."""
    prepare_libvirt_for_process()
    conn = libvirt.open(URI)
    yield conn
    for dom in conn.listAllDomains(0):
        if dom.name().startswith(PREFIX):
            if dom.isActive():
                dom.destroy()
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
    pool = conn.storagePoolLookupByName("default-pool")
    for volume in pool.listAllVolumes(0):
        if volume.name().startswith(PREFIX):
            volume.delete(0)
    conn.close()


@pytest.fixture
def gate(other: Any) -> Iterator[EventGate]:
    held = EventGate(other)
    yield held
    held.open()


@pytest.fixture
def backend_and_connection(
    other: Any, gate: EventGate
) -> Iterator[tuple[Backend, LibvirtConnection]]:
    connection = LibvirtConnection(URI)
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="test",
        pools=PoolSettings(default_pool="default-pool"),
    )
    ok(backend.inventory.list_vms())  # subscribes, after the gate
    yield backend, connection
    connection.close()


@pytest.fixture
def backend(backend_and_connection: tuple[Backend, LibvirtConnection]) -> Any:
    return backend_and_connection[0]


def create(backend: Backend, name: str, cpu: int = 1) -> str:
    request = CreateRequest(name=PREFIX + name, vm_class=VMClass(cpu=cpu, memory_mib=256))
    return ok(create_vm(backend, request, OWNER))


def described(backend: Backend, vm_id: str) -> VMDescription:
    description = ok(backend.inventory.describe(vm_id))
    assert description is not None
    return description


def listed_power(backend: Backend, vm_id: str) -> PowerState | None:
    return next((vm.power_state for vm in ok(backend.inventory.list_vms()) if vm.id == vm_id), None)


def eventually(check: Callable[[], bool]) -> None:
    """Until `check` holds: libvirt's events or the background refresh got there (bounded)."""
    deadline = time.monotonic() + EVENT_WAIT_SECONDS
    while not check():
        assert time.monotonic() < deadline, "the backend never showed it"
        time.sleep(0.01)


def live_cpu(description: VMDescription) -> str:
    return dict(description.raw)["cpu"]


def test_describe_answers_from_the_cache(backend: Backend, other: Any, gate: EventGate) -> None:
    vm_id = create(backend, "cached", cpu=2)
    ok(backend.power.power_on(vm_id))
    gate.settle()  # the "started" event, which drops the view, is behind us
    assert live_cpu(described(backend, vm_id)) == "2"
    # A live vCPU change is one the test driver announces with no event: a cached answer
    # cannot know of it, a read from libvirt would.
    other.lookupByUUIDString(vm_id).setVcpusFlags(1, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert live_cpu(described(backend, vm_id)) == "2"
    ok(backend.power.reboot(vm_id))  # our own write: read afresh
    assert live_cpu(described(backend, vm_id)) == "1"


def test_another_writers_changes_arrive_by_events(backend: Backend, other: Any) -> None:
    vm_id = create(backend, "events")
    assert described(backend, vm_id).power_state is PowerState.OFF
    dom = other.lookupByUUIDString(vm_id)
    dom.create()
    eventually(lambda: described(backend, vm_id).power_state is PowerState.ON)
    assert listed_power(backend, vm_id) is PowerState.ON
    dom.destroy()
    eventually(lambda: described(backend, vm_id).power_state is PowerState.OFF)
    # A redefinition (another replica's Reconfigure) comes as a "defined" event.
    xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE).replace(
        "<vcpu placement='static'>1</vcpu>", "<vcpu placement='static'>3</vcpu>"
    )
    other.defineXML(xml)
    eventually(lambda: live_cpu(described(backend, vm_id)) == "3")
    vms = {vm.id: vm for vm in ok(backend.inventory.list_vms())}
    assert vms[vm_id].cpu == 3


def test_own_writes_are_read_back_before_any_event(backend: Backend, gate: EventGate) -> None:
    vm_id = create(backend, "writes")
    ok(present(backend.snapshots).create_snapshot(SnapshotRequest(vm_id=vm_id, name="off")))
    assert described(backend, vm_id).power_state is PowerState.OFF
    gate.close()  # from here on the backend hears no event
    ok(backend.power.power_on(vm_id))
    assert described(backend, vm_id).power_state is PowerState.ON
    assert listed_power(backend, vm_id) is PowerState.ON
    ok(backend.power.power_off(vm_id))
    assert described(backend, vm_id).power_state is PowerState.OFF
    assert listed_power(backend, vm_id) is PowerState.OFF
    ok(backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=2)))
    assert live_cpu(described(backend, vm_id)) == "2"
    assert next(vm.cpu for vm in ok(backend.inventory.list_vms()) if vm.id == vm_id) == 2
    ok(backend.power.power_on(vm_id))
    ok(present(backend.snapshots).revert_snapshot(vm_id, "off"))
    assert described(backend, vm_id).power_state is PowerState.OFF
    assert live_cpu(described(backend, vm_id)) == "1"
    clone_id = ok(
        clone_vm(backend, CloneRequest(source_vm_id=vm_id, target_name=PREFIX + "clone"), OWNER)
    )
    assert described(backend, clone_id).power_state is PowerState.OFF
    assert listed_power(backend, clone_id) is PowerState.OFF
    ok(backend.lifecycle.delete(clone_id))
    assert ok(backend.inventory.describe(clone_id)) is None
    assert listed_power(backend, clone_id) is None
    gate.open()


def test_a_vm_deleted_behind_our_back_reads_as_missing(backend: Backend, other: Any) -> None:
    vm_id = create(backend, "deleted")
    described(backend, vm_id)
    other.lookupByUUIDString(vm_id).undefineFlags(0)
    assert listed_power(backend, vm_id) is None  # the listing asks libvirt which domains exist
    eventually(lambda: ok(backend.inventory.describe(vm_id)) is None)


def test_a_new_connection_starts_afresh_and_hears_events(
    backend_and_connection: tuple[Backend, LibvirtConnection], other: Any
) -> None:
    backend, connection = backend_and_connection
    vm_id = create(backend, "reconnect", cpu=2)
    ok(backend.power.power_on(vm_id))
    assert live_cpu(described(backend, vm_id)) == "2"
    connection.close()  # as a dropped daemon connection would be replaced
    other.lookupByUUIDString(vm_id).setVcpusFlags(1, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert live_cpu(described(backend, vm_id)) == "1"  # nothing from before survives
    other.lookupByUUIDString(vm_id).destroy()
    eventually(lambda: described(backend, vm_id).power_state is PowerState.OFF)


def test_a_connection_closed_under_the_adapter_is_replaced(
    backend_and_connection: tuple[Backend, LibvirtConnection], other: Any
) -> None:
    backend, connection = backend_and_connection
    vm_id = create(backend, "closed", cpu=2)
    ok(backend.power.power_on(vm_id))
    assert live_cpu(described(backend, vm_id)) == "2"
    ok(connection.call(lambda conn: conn)).close()  # the connection object itself, not the wrapper
    other.lookupByUUIDString(vm_id).setVcpusFlags(1, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert live_cpu(described(backend, vm_id)) == "1"
    other.lookupByUUIDString(vm_id).destroy()
    eventually(lambda: described(backend, vm_id).power_state is PowerState.OFF)


class Tally:
    """A counter callback, as the metrics give the adapters."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_a_describe_the_cache_answers_makes_no_round_trip_and_a_new_feed_is_a_resync(
    other: Any, gate: EventGate
) -> None:
    round_trips, resyncs = Tally(), Tally()
    connection = LibvirtConnection(URI, on_round_trip=round_trips)
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="test",
        pools=PoolSettings(default_pool="default-pool"),
        on_resync=resyncs,
    )
    try:
        ok(backend.inventory.list_vms())  # subscribes, after the gate
        vm_id = create(backend, "round-trips")
        gate.settle()  # the "defined" event, which drops the view, is behind us
        before = round_trips.count
        described(backend, vm_id)  # our own write dropped it: read from libvirt
        assert round_trips.count == before + 1
        described(backend, vm_id)
        described(backend, vm_id)
        assert round_trips.count == before + 1  # answered from the cache
        ok(backend.power.power_on(vm_id))
        assert round_trips.count == before + 2
        assert resyncs.count == 0  # the first feed is no resync
        connection.close()  # as a dropped daemon connection would be replaced
        described(backend, vm_id)
        assert resyncs.count == 1
        assert round_trips.count == before + 3  # nothing from before survives: read again
    finally:
        connection.close()


def test_a_describe_the_cache_answers_takes_no_call_slot(other: Any, gate: EventGate) -> None:
    """A cache hit reads the cache alone: with the one call slot held, a cached VM is still
    described, while a VM the cache does not hold waits for the slot (RESOURCE_EXHAUSTED)."""
    connection = LibvirtConnection(URI, max_concurrent_calls=1, slot_wait_seconds=0)
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="test",
        pools=PoolSettings(default_pool="default-pool"),
    )
    holding, release = threading.Event(), threading.Event()

    def hold_the_slot(conn: Any) -> None:
        holding.set()
        release.wait(EVENT_WAIT_SECONDS)  # bounded: a failed test never hangs

    try:
        ok(backend.inventory.list_vms())  # subscribes, after the gate
        vm_id = create(backend, "no-slot")
        gate.settle()  # the "defined" event, which drops the view, is behind us
        described(backend, vm_id)  # our own write dropped it: read, and kept
        holder = threading.Thread(target=connection.call, args=(hold_the_slot,))
        holder.start()
        assert holding.wait(EVENT_WAIT_SECONDS)
        assert described(backend, vm_id).power_state is PowerState.OFF
        missing = "00000000-0000-0000-0000-000000000000"
        assert error_kind(backend.inventory.describe(missing)) is ErrorKind.RESOURCE_EXHAUSTED
        release.set()
        holder.join()
    finally:
        release.set()
        connection.close()


def test_addresses_come_from_the_background_once_known(backend: Backend, other: Any) -> None:
    vm_id = create(backend, "addresses")
    ok(backend.power.power_on(vm_id))
    first = described(backend, vm_id).ips
    assert first  # the test driver answers with made-up addresses
    # The power-on's own event may land after that read and drop it: the background refresh
    # brings the addresses back.
    eventually(
        lambda: next(vm.ips for vm in ok(backend.inventory.list_vms()) if vm.id == vm_id) == first
    )
    other.lookupByUUIDString(vm_id).destroy()
    eventually(lambda: described(backend, vm_id).ips == ())


def test_a_read_that_raced_with_a_drop_is_not_kept(backend: Backend, other: Any) -> None:
    vm_id = create(backend, "race")
    own = libvirt.open(URI)  # libvirt takes one callback per event and connection
    cache = DomainCache(lambda _dom: (), clock=ManualClock())
    cache.attach(own)
    dom = own.lookupByUUIDString(vm_id)
    with cache.loading() as load:
        stale = read_view(dom)
        cache.forget(vm_id)  # an event (or our own write) while the read was on its way
        load.keep_view(vm_id, stale)
    assert cache.view(vm_id) is None
    with cache.loading() as load:
        load.keep_view(vm_id, read_view(dom))
    assert cache.view(vm_id) is not None
    own.close()


def test_without_events_every_read_asks_libvirt(
    backend_and_connection: tuple[Backend, LibvirtConnection], other: Any
) -> None:
    backend, connection = backend_and_connection
    # libvirt takes one callback per event and connection: this second backend gets none.
    unsubscribed = libvirt_test_backend(connection, ManualClock(), domain_type="test")
    vm_id = create(backend, "no-events", cpu=2)
    ok(backend.power.power_on(vm_id))
    assert live_cpu(described(unsubscribed, vm_id)) == "2"
    other.lookupByUUIDString(vm_id).setVcpusFlags(1, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert live_cpu(described(unsubscribed, vm_id)) == "1"  # no event, yet seen at once


def test_closing_the_connection_first_deregisters_the_callbacks_so_it_is_freed(
    backend_and_connection: tuple[Backend, LibvirtConnection],
) -> None:
    _, connection = backend_and_connection
    closed = weakref.ref(ok(connection.call(lambda conn: conn)))
    connection.close()
    # Registered callbacks would hold it for good; the refresher may still be listing on it.
    eventually(lambda: gc.collect() >= 0 and closed() is None)


@pytest.mark.parametrize(
    ("state", "power"),
    [
        (libvirt.VIR_DOMAIN_RUNNING, PowerState.ON),
        (libvirt.VIR_DOMAIN_BLOCKED, PowerState.ON),
        # Still stopping: QEMU holds the disks until it exits, so not yet Off.
        (libvirt.VIR_DOMAIN_SHUTDOWN, PowerState.ON),
        (libvirt.VIR_DOMAIN_SHUTOFF, PowerState.OFF),
        (libvirt.VIR_DOMAIN_PAUSED, PowerState.OFF),
        (libvirt.VIR_DOMAIN_PMSUSPENDED, PowerState.OFF),
        (libvirt.VIR_DOMAIN_CRASHED, PowerState.OFF),
    ],
)
def test_a_domain_is_on_until_it_has_stopped(state: int, power: PowerState) -> None:
    assert power_of(state) is power
