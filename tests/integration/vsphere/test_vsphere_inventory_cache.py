"""The inventory cache on the simulator: Describe and ListVMs answer with no vCenter call once
warm, show this replica's writes as soon as they report done, show other clients' changes
soon after, and stay right across a cold start and a lost session; a ListVMs during a cold
start waits for the feed's first view rather than read every VM beside it.

Calls are counted by the replica's own session (its `on_call`, which feeds the server's
pyrigaud_hypervisor_round_trips): every call into vCenter goes through it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.vsphere import inventory
from pyrigaud.adapters.hypervisors.vsphere.inventory_cache import InventoryCache
from pyrigaud.adapters.hypervisors.vsphere.properties import VM_PROPERTIES, retrieve_all_vms
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import VMEntry, vm_info
from pyrigaud.domain.models import OwnerMark, VMChanges, VMDescription, VMInfo
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef, TaskState

from contract.harness import made
from support import ok
from support.vsphere import (
    Simulator,
    backend_over,
    eventually,
    running_simulator,
    template_request,
    vm_ref,
)

OWNER = OwnerMark(provider="tests/vsphere-inventory-cache")
vim: Any = untyped_vim  # pyVmomi's data-object constructors are untyped
T = TypeVar("T")


class Replica:
    """One replica's ports over a session whose vCenter calls are counted."""

    def __init__(self, simulator: Simulator) -> None:
        self.calls: list[int] = []
        self.session = VSphereSession(
            simulator.endpoint,
            lambda: (simulator.username, simulator.password),
            insecure=True,
            on_call=lambda: self.calls.append(1),
            clock=SystemClock(),
        )
        self.resyncs: list[int] = []
        self.backend = backend_over(self.session, on_resync=lambda: self.resyncs.append(1))

    def calls_for(self, action: Callable[[], T]) -> tuple[T, int]:
        before = len(self.calls)
        value = action()
        return value, len(self.calls) - before

    def describe(self, vm_id: str) -> VMDescription | None:
        return ok(self.backend.inventory.describe(vm_id))

    def listed(self, vm_id: str) -> VMInfo | None:
        return next((vm for vm in ok(self.backend.inventory.list_vms()) if vm.id == vm_id), None)

    def warm(self) -> bool:
        """Whether a ListVMs now costs no vCenter call (the cache answered it)."""
        return self.calls_for(lambda: ok(self.backend.inventory.list_vms()))[1] == 0

    def wait_warm(self) -> None:
        assert eventually(self.warm, bool)

    def settle(self, task: TaskRef | None) -> None:
        """TaskStatus of the task until done, as the manager polls it (None: no task)."""
        if task is None:
            return
        state = eventually(
            lambda: self.backend.tasks.task_state(task.id), lambda s: s is not None and s.done
        )
        assert state == TaskState.succeeded()


@pytest.fixture
def replica(simulator: Simulator) -> Iterator[Replica]:
    made_here = Replica(simulator)
    made_here.wait_warm()
    before = {vm.id for vm in ok(made_here.backend.inventory.list_vms())}
    yield made_here
    for vm in ok(made_here.backend.inventory.list_vms()):
        if vm.id not in before:
            ok(made_here.backend.lifecycle.delete(vm.id))
    made_here.session.close()


@pytest.fixture
def outsider(simulator: Simulator) -> Iterator[VSphereSession]:
    """Another vCenter client, straight through pyVmomi."""
    session = simulator.session()
    yield session
    session.close()


def test_warm_describe_and_list_make_no_vcenter_call_and_agree_with_vcenter(
    replica: Replica, outsider: VSphereSession
) -> None:
    vms, calls = replica.calls_for(lambda: ok(replica.backend.inventory.list_vms()))
    assert vms
    assert calls == 0
    descriptions, calls = replica.calls_for(lambda: [replica.describe(vm.id) for vm in vms])
    assert calls == 0
    rows = outsider.call(lambda instance: retrieve_all_vms(instance, VM_PROPERTIES))
    assert sorted(vms, key=lambda vm: vm.id) == sorted(map(vm_info, rows), key=lambda vm: vm.id)
    for vm, description in zip(vms, descriptions, strict=True):
        assert description is not None
        assert description.power_state is vm.power_state
        assert description.raw["name"] == vm.name
        assert description.raw["numCPU"] == str(vm.cpu)


def test_own_writes_show_as_soon_as_they_report_done(replica: Replica) -> None:
    backend = replica.backend
    vm_id = made(backend.tasks, backend.lifecycle.start_create(template_request("vc-own"), OWNER))
    listed, calls = replica.calls_for(lambda: replica.listed(vm_id))
    assert listed is not None
    assert listed.cpu == 2
    assert calls == 0

    for change, state in (
        (backend.power.power_on, PowerState.ON),
        (backend.power.power_off, PowerState.OFF),
    ):
        replica.settle(ok(change(vm_id)))
        description, calls = replica.calls_for(lambda: replica.describe(vm_id))
        assert description is not None
        assert description.power_state is state
        assert calls == 0  # answered by the cache, which the write had updated

    replica.settle(ok(backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=3, memory_mib=1024))))
    description, calls = replica.calls_for(lambda: replica.describe(vm_id))
    assert description is not None
    assert calls == 0
    assert (description.raw["numCPU"], description.raw["memoryMB"]) == ("3", "1024")
    listed = replica.listed(vm_id)
    assert listed is not None
    assert (listed.cpu, listed.memory_mib) == (3, 1024)

    ok(backend.lifecycle.delete(vm_id))
    assert replica.describe(vm_id) is None
    assert replica.listed(vm_id) is None


def test_another_clients_changes_show_without_a_call(
    replica: Replica, outsider: VSphereSession
) -> None:
    backend = replica.backend
    vm_id = made(backend.tasks, backend.lifecycle.start_create(template_request("vc-out"), OWNER))
    vm = outsider.call(lambda instance: vm_ref(instance, vm_id))

    outsider.call(lambda _: vm.Rename_Task("vc-out-renamed"))
    outsider.call(lambda _: vm.ReconfigVM_Task(vim.vm.ConfigSpec(numCPUs=5)))
    outsider.call(lambda _: vm.PowerOffVM_Task())

    def seen(description: VMDescription | None) -> bool:
        return description is not None and (
            description.raw["name"],
            description.raw["numCPU"],
            description.power_state,
        ) == ("vc-out-renamed", "5", PowerState.OFF)

    assert seen(eventually(lambda: replica.describe(vm_id), seen))
    listed, calls = replica.calls_for(lambda: replica.listed(vm_id))
    assert calls == 0
    assert listed is not None
    assert (listed.name, listed.cpu) == ("vc-out-renamed", 5)

    outsider.call(lambda _: vm.Destroy_Task())
    assert eventually(lambda: replica.listed(vm_id), lambda found: found is None) is None
    assert replica.describe(vm_id) is None


def test_a_lost_session_resynchronises_the_view_and_is_counted(
    replica: Replica, outsider: VSphereSession
) -> None:
    vm_id = made(
        replica.backend.tasks,
        replica.backend.lifecycle.start_create(template_request("vc-lost"), OWNER),
    )
    vm = outsider.call(lambda instance: vm_ref(instance, vm_id))

    def drop_every_other_session(instance: Any) -> None:
        manager = instance.content.sessionManager
        mine = manager.currentSession.key
        others = [session.key for session in manager.sessionList if session.key != mine]
        manager.TerminateSession(others)

    outsider.call(drop_every_other_session)  # the replica's own and its feed's
    outsider.call(lambda _: vm.Rename_Task("vc-lost-renamed"))
    # Answers stay right while the feed reads everything again (vCenter is read meanwhile).
    renamed = eventually(
        lambda: replica.describe(vm_id),
        lambda found: found is not None and found.raw["name"] == "vc-lost-renamed",
    )
    assert renamed is not None
    assert renamed.raw["name"] == "vc-lost-renamed"
    assert eventually(lambda: len(replica.resyncs), lambda count: count >= 1) == 1
    replica.wait_warm()
    listed, calls = replica.calls_for(lambda: replica.listed(vm_id))
    assert calls == 0
    assert listed is not None
    assert listed.name == "vc-lost-renamed"


@pytest.fixture(scope="module")
def slow_feed() -> Iterator[Simulator]:
    """60 VMs, and every property collector made 3 s late: a new replica's feed reads its
    first view 3 s after the replica is up (a provider just restarted)."""
    with running_simulator("-vm", "30", "-method-delay", "CreatePropertyCollector=3000") as slow:
        yield slow


def every_vm(simulator: Simulator) -> list[VMInfo]:
    """What vCenter has, read by another client."""
    session = simulator.session()
    try:
        rows = session.call(lambda instance: retrieve_all_vms(instance, VM_PROPERTIES))
    finally:
        session.close()
    return sorted(map(vm_info, rows), key=lambda vm: vm.id)


def test_while_the_feed_reads_its_first_view_describe_reads_vcenter_and_list_waits_for_it(
    slow_feed: Simulator,
) -> None:
    """A ListVMs during warm-up makes no read of every VM beside the feed's: it waits for the
    feed's first complete view and lists every VM from it."""
    expected = every_vm(slow_feed)
    assert len(expected) == 60
    replica = Replica(slow_feed)
    try:
        description, calls = replica.calls_for(lambda: replica.describe(expected[0].id))
        assert description is not None
        assert calls == 1  # cold: read from vCenter
        vms, calls = replica.calls_for(lambda: ok(replica.backend.inventory.list_vms()))
        assert calls == 0
        assert sorted(vms, key=lambda vm: vm.id) == expected
        assert replica.calls_for(lambda: replica.describe(expected[0].id)) == (description, 0)
        assert replica.resyncs == []
    finally:
        replica.session.close()


def test_a_list_that_waited_its_bound_for_the_feed_reads_vcenter_itself(
    slow_feed: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inventory, "WARM_WAIT_SECONDS", 0.2)
    expected = every_vm(slow_feed)
    replica = Replica(slow_feed)
    try:
        vms, calls = replica.calls_for(lambda: ok(replica.backend.inventory.list_vms()))
        assert calls == 1
        assert sorted(vms, key=lambda vm: vm.id) == expected
        replica.wait_warm()
        assert sorted(ok(replica.backend.inventory.list_vms()), key=lambda vm: vm.id) == expected
    finally:
        replica.session.close()


def test_a_list_waits_only_while_the_feed_reads_the_view(simulator: Simulator) -> None:
    """A cache with no feed: new, it is reading (a list whose bound runs out has nothing);
    once the feed broke (`doubt`), a list does not wait at all, whatever its bound; while the
    feed reads the view again, a waiting list answers that view once it is read."""
    session = simulator.session()
    try:
        cache = InventoryCache(VCenter(session))
        assert cache.entries_once_read(0.1) is None
        cache.doubt()
        assert answered_within(LIVENESS_SECONDS, lambda: cache.entries_once_read(3600)) == [None]
        cache.go_cold()  # the feed reads the whole view again
        listed: list[list[VMEntry] | None] = []
        lister = threading.Thread(target=lambda: listed.append(cache.entries_once_read(3600)))
        lister.start()
        uuid = "c0ffee00-0000-4000-8000-000000000001"
        cache.keep(VMEntry("vm-1", uuid, "one", True, (), 1, 512, (), (), "", ""), cache.begin())
        cache.go_warm()
        lister.join(LIVENESS_SECONDS)
        assert not lister.is_alive(), "a list went on waiting once the feed had read the view"
        assert [[entry.moref for entry in entries or []] for entries in listed] == [["vm-1"]]
    finally:
        session.close()


LIVENESS_SECONDS = 60  # a liveness bound: only a list that waits for nothing goes past it


def answered_within(seconds: float, call: Callable[[], object]) -> list[object]:
    """`call`'s answer, from a thread given `seconds` to answer: a test failure if it hangs."""
    answers: list[object] = []
    caller = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    caller.start()
    caller.join(seconds)
    assert not caller.is_alive(), f"no answer within {seconds} s: it waits for nothing"
    return answers
