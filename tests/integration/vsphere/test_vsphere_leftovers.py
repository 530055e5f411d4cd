"""Crash safety on the simulator: what a Create killed part-way leaves is found and replaced."""

from __future__ import annotations

from typing import Any

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.properties import (
    extra_config,
    retrieve,
    retrieve_all_vms,
)
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import BUILDING_KEY, OWNER_KEY
from pyrigaud.application.backend import Backend
from pyrigaud.application.use_cases.sweep_leftovers import SweepLeftovers
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import CloneRequest, OwnerMark

from contract.harness import made
from support import ManualClock, ok, present
from support.vsphere import TEMPLATE_VM, Simulator, create_use_case, template_request, vm_ref

OWNER = OwnerMark(provider="tests/vsphere-leftovers")
POLICY = LeftoverPolicy(owner=OWNER, abandoned_after_seconds=60)
vim: Any = untyped_vim  # pyVmomi's data-object constructors are untyped


request = template_request


def killed_create(simulator: Simulator, name: str, started: float) -> str:
    """The VM a Create killed right after its clone leaves: marked, still building."""
    session = simulator.session()

    def clone(instance: Any) -> str:
        source = next(
            row["_ref"]
            for row in retrieve_all_vms(instance, ("name",))
            if row.get("name") == TEMPLATE_VM
        )
        marks = {OWNER_KEY: OWNER.provider, BUILDING_KEY: f"{started:.0f}"}
        spec = vim.vm.CloneSpec(
            location=vim.vm.RelocateSpec(),
            powerOn=False,
            template=False,
            config=vim.vm.ConfigSpec(
                extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in marks.items()]
            ),
        )
        parent = instance.content.rootFolder.childEntity[0].vmFolder
        task = source.CloneVM_Task(folder=parent, name=name, spec=spec)
        return str(task.info.result.config.instanceUuid)

    try:
        return session.call(clone)
    finally:
        session.close()


def building_mark(simulator: Simulator, vm_id: str) -> str:
    session = simulator.session()
    try:
        row = session.call(
            lambda instance: retrieve(instance, [vm_ref(instance, vm_id)], ("config.extraConfig",))
        )[0]
    finally:
        session.close()
    return extra_config(row).get(BUILDING_KEY, "")


def test_a_completed_create_or_clone_leaves_no_building_mark(
    simulator: Simulator, backend: Backend
) -> None:
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request("vs-finished"), OWNER))
    assert building_mark(simulator, vm_id) == ""
    record = ok(backend.lifecycle.find_by_name("vs-finished"))
    assert record is not None
    assert (record.owner, record.building_since) == (OWNER, None)
    copy = made(
        backend.tasks,
        present(backend.cloning).start_clone(
            CloneRequest(source_vm_id=vm_id, target_name="vs-finished-2"), OWNER
        ),
    )
    assert building_mark(simulator, copy) == ""
    assert ok(backend.lifecycle.find_unfinished()) == []


def test_a_killed_create_is_reported_and_replaced_once_abandoned(
    simulator: Simulator,
    backend: Backend,  # the fixture removes the VMs made
) -> None:
    clock = ManualClock()
    dated = simulator.backend(clock)
    leftover = killed_create(simulator, "vs-killed", started=clock.now() - 120)
    unfinished = ok(dated.lifecycle.find_unfinished())
    assert [(r.id, r.name, r.owner) for r in unfinished] == [(leftover, "vs-killed", OWNER)]
    assert unfinished[0].building_since == clock.now() - 120
    record = ok(dated.lifecycle.find_by_name("vs-killed"))
    assert record is not None
    assert record.building_since == clock.now() - 120

    created = ok(create_use_case(dated, OWNER, clock, POLICY)(request("vs-killed")))
    assert created.id != leftover
    assert ok(dated.inventory.describe(leftover)) is None
    assert ok(dated.lifecycle.find_unfinished()) == []
    info = ok(dated.inventory.vm_info(created.id))
    assert info is not None
    assert (info.name, info.cpu, info.memory_mib) == ("vs-killed", 2, 512)


def test_the_sweep_removes_abandoned_leftovers_only(
    simulator: Simulator,
    backend: Backend,  # the fixture removes the VMs made
) -> None:
    clock = ManualClock()
    dated = simulator.backend(clock)
    old = killed_create(simulator, "vs-swept", started=clock.now() - 120)
    young = killed_create(simulator, "vs-in-progress", started=clock.now() - 10)
    report = ok(SweepLeftovers(dated.lifecycle, clock, POLICY)())
    assert report.removed == ("vs-swept",)
    assert report.failures == ()
    assert ok(dated.inventory.describe(old)) is None
    assert [record.id for record in ok(dated.lifecycle.find_unfinished())] == [young]
    ok(dated.lifecycle.delete(young))  # an unfinished VM is removed whole
    assert ok(dated.lifecycle.find_by_name("vs-in-progress")) is None
