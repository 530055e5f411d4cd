"""Update sets over a container view of the VMs, as vCenter sends them and as the inventory
cache's feed reads them: a large set comes in pages of at most maxObjectUpdates, truncated but
the last, that together hold every VM once; and a change to one VM sends that VM's changed
properties alone."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from pyVmomi import vim as untyped_vim
from pyVmomi import vmodl as untyped_vmodl

from pyrigaud.adapters.hypervisors.vsphere.properties import (
    VM_PROPERTIES,
    retrieve_all_vms,
    view_filter,
)
from pyrigaud.adapters.hypervisors.vsphere.session import Connection, VSphereSession

from support.vsphere import Simulator

vim: Any = untyped_vim  # pyVmomi's data-object constructors are untyped
vmodl: Any = untyped_vmodl

PAGE = 3  # fewer than the default inventory's VMs, so the first set takes several pages
PATIENCE_SECONDS = 15  # a long-poll's bound: it answers as soon as there is a change


class Watch:
    """A login of its own with a container view of the VMs and a collector whose one filter
    selects the feed's properties over the view; `version` is where its long-poll stands."""

    def __init__(self, session: VSphereSession) -> None:
        self.connection: Connection = session.open_private()
        content = self.connection.content
        self.view = content.viewManager.CreateContainerView(
            content.rootFolder, [vim.VirtualMachine], True
        )
        self.collector = content.propertyCollector.CreatePropertyCollector()
        self.collector.CreateFilter(
            view_filter(self.view, vim.VirtualMachine, VM_PROPERTIES), partialUpdates=True
        )
        self.version = ""

    def wait(self, seconds: int, max_updates: int | None = None) -> Any:
        options = vmodl.query.PropertyCollector.WaitOptions(
            maxWaitSeconds=seconds, maxObjectUpdates=max_updates
        )
        update = self.collector.WaitForUpdatesEx(self.version, options)
        if update is not None:
            self.version = update.version
        return update

    def close(self) -> None:
        self.collector.DestroyPropertyCollector()
        self.view.DestroyView()
        VSphereSession.end_private(self.connection)


@pytest.fixture
def watch(simulator: Simulator) -> Iterator[Watch]:
    watching = Watch(simulator.session())
    yield watching
    watching.close()


def object_updates(update: Any) -> list[Any]:
    return [change for part in update.filterSet or () for change in part.objectSet or ()]


def vms(watch: Watch) -> list[Any]:
    """The VMs one retrieval through a view finds (a view may also list a VM the simulator
    removed from its inventory but not from a host's or pool's list: no update names it)."""
    return [row["_ref"] for row in retrieve_all_vms(watch.connection, ["name"])]


def test_the_first_update_set_comes_in_truncated_pages_that_hold_every_vm_once(
    watch: Watch,
) -> None:
    present = sorted(str(vm._moId) for vm in vms(watch))
    assert len(present) > PAGE

    pages = [watch.wait(0, max_updates=PAGE)]
    while pages[-1].truncated and len(pages) <= len(present):
        pages.append(watch.wait(0, max_updates=PAGE))

    sizes = [len(object_updates(page)) for page in pages]
    assert sizes[:-1] == [PAGE] * (len(pages) - 1)
    assert len(pages) == math.ceil(len(present) / PAGE)
    assert [bool(page.truncated) for page in pages] == [True] * (len(pages) - 1) + [False]
    entered = [change for page in pages for change in object_updates(page)]
    assert {change.kind for change in entered} == {"enter"}
    assert sorted(str(change.obj._moId) for change in entered) == present
    assert all({item.name for item in change.changeSet} >= {"name"} for change in entered)


def test_a_version_that_is_not_the_last_one_answered_is_refused(watch: Watch) -> None:
    first = watch.wait(0, max_updates=PAGE)
    watch.wait(0, max_updates=PAGE)
    with pytest.raises(vmodl.fault.InvalidArgument):
        watch.collector.WaitForUpdatesEx(first.version, None)


def test_a_change_to_one_vm_sends_that_vms_changed_properties_alone(
    watch: Watch, simulator: Simulator
) -> None:
    while watch.wait(0).truncated:  # the whole view, in as many pages as it takes
        pass
    vm = vms(watch)[0]
    name = str(vm.name)
    outsider = simulator.session()

    def rename(to: str) -> None:
        outsider.call(lambda instance: vim.VirtualMachine(vm._moId, instance._stub).Rename_Task(to))

    try:
        rename(name + "-renamed")
        sent = [watch.wait(PATIENCE_SECONDS)]
        while sent[-1] is not None:  # the rest of the burst, if it came in more than one set
            sent.append(watch.wait(0))

        changes = [change for update in sent[:-1] for change in object_updates(update)]
        assert [
            (str(change.obj._moId), change.kind, {item.name: item.val for item in change.changeSet})
            for change in changes
        ] == [(str(vm._moId), "modify", {"name": name + "-renamed"})]
    finally:
        rename(name)
        outsider.close()
