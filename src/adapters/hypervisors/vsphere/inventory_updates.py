"""The inventory cache's feed: one `WaitForUpdatesEx` long-poll over a container view of the
VMs, on a login of its own, in a daemon thread.

A VM that enters the view arrives with its properties; a VM that changes is re-read (one
batched read per update set), so that an entry always comes from one complete read and never
from a patched guess; a VM that leaves is dropped. vCenter reports the properties it changes;
the simulator does not report a reconfigure's CPU or memory, so the feed also follows the task
manager's recent tasks and re-reads the VM a task worked on once the task has ended.

A lost session or a failed long-poll drops the feed: the cache goes cold (readers go to vCenter
meanwhile, never waiting), the break is counted (`on_resync`), and a new login reads the whole
view again. The thread holds the cache weakly and ends with the session (or with the cache).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from pyVmomi import vim as untyped_vim
from pyVmomi import vmodl as untyped_vmodl
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_raise
from pyrigaud.adapters.hypervisors.vsphere.calls import attempt, best_effort, or_none
from pyrigaud.adapters.hypervisors.vsphere.inventory_cache import About, InventoryCache
from pyrigaud.adapters.hypervisors.vsphere.properties import VM_PROPERTIES, retrieve, view_filter
from pyrigaud.adapters.hypervisors.vsphere.session import Connection, VSphereSession
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import vm_entry
from pyrigaud.domain.errors import ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim
vmodl: Any = untyped_vmodl

logger = logging.getLogger(__name__)

WAIT_SECONDS = 1  # a long-poll's longest wait: how soon the thread notices it should stop
MAX_OBJECT_UPDATES = 1000  # vCenter pages a large update set (truncated), and so does the launcher
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)  # after a failed login or poll, growing, then steady
TASK_PROPERTIES = ("info.entity", "info.state")
ENDED_TASK_STATES = ("success", "error")


def follow(session: VSphereSession, cache: InventoryCache, on_resync: Callable[[], None]) -> None:
    """Start the feed's daemon thread; it stops when the session closes."""
    stop = threading.Event()
    thread = threading.Thread(
        target=_run,
        args=(session, weakref.ref(cache), stop, on_resync),
        name="vsphere-inventory-updates",
        daemon=True,
    )

    def halt() -> None:
        stop.set()
        thread.join(timeout=WAIT_SECONDS + 5)

    session.on_close(halt)
    thread.start()


def _run(
    session: VSphereSession,
    cache_ref: weakref.ref[InventoryCache],
    stop: threading.Event,
    on_resync: Callable[[], None],
) -> None:
    feed: _Feed | None = None
    failures = 0
    while not stop.is_set():
        cache = cache_ref()
        if cache is None:
            break
        if feed is not None and cache.doubted:
            best_effort(partial(_drop, feed, cache, on_resync))
            feed = None
        try:
            step = attempt(
                "following vSphere inventory updates",
                partial(_step, session, feed, cache, on_resync),
            )
        except Exception:  # a bug: say so, and start over
            logger.exception("vSphere inventory updates failed")
            failures += 1
        else:
            match step:
                case Success(stepped):
                    feed = stepped
                    failures = 0
                case Failure(error):
                    logger.warning("%s; resynchronising", error)
                    failures += 1
        if failures:
            if feed is not None:
                _drop(feed, cache, on_resync)
                feed = None
            cache.doubt()
            stop.wait(RETRY_SECONDS[min(failures, len(RETRY_SECONDS)) - 1])
        del cache
    if feed is not None:
        feed.close()


def _step(
    session: VSphereSession,
    feed: _Feed | None,
    cache: InventoryCache,
    on_resync: Callable[[], None],
) -> Result[_Feed, ProviderError]:
    """One turn of the feed: a new one reads the whole view (dropped again if it cannot), a
    running one polls once."""
    if feed is not None:
        feed.poll(cache)
        return Success(feed)
    cache.go_cold()
    fresh = _Feed.open(session)
    undone_on_raise(partial(fresh.start, cache), partial(_drop, fresh, cache, on_resync))
    return Success(fresh)


def _drop(feed: _Feed, cache: InventoryCache, on_resync: Callable[[], None]) -> None:
    """End a feed that broke or that the cache doubts; counted as one resync."""
    cache.doubt()
    feed.close()
    on_resync()


class _Feed:
    """One login's container view, property collector and filters, and where the long-poll
    stands (its version and the tasks it waits on)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        content = connection.content
        self._view = content.viewManager.CreateContainerView(
            content.rootFolder, [vim.VirtualMachine], True
        )
        self._collector = content.propertyCollector.CreatePropertyCollector()
        self._collector.CreateFilter(
            view_filter(self._view, vim.VirtualMachine, VM_PROPERTIES), partialUpdates=True
        )
        self._collector.CreateFilter(_task_filter(content.taskManager), partialUpdates=True)
        self._version = ""
        self._recent_tasks: set[str] = set()
        self._waiting_tasks: set[str] = set()
        self._about = About(str(content.about.apiType), str(content.about.instanceUuid))

    @classmethod
    def open(cls, session: VSphereSession) -> _Feed:
        connection = session.open_private()
        return undone_on_raise(
            partial(cls, connection), partial(VSphereSession.end_private, connection)
        )

    def start(self, cache: InventoryCache) -> None:
        """Read the whole view (update sets until one is complete), then answer from it."""
        cache.about = self._about
        while True:
            begun = cache.begin()
            update = self._wait(0)
            if update is not None:
                self._apply(cache, update, begun)
            if update is None or not update.truncated:
                break
        cache.go_warm()

    def poll(self, cache: InventoryCache) -> None:
        """One long-poll turn: what changed since the last one, and the VMs whose task ended."""
        begun = cache.begin()
        update = self._wait(WAIT_SECONDS)
        stale = self._apply(cache, update, begun) if update is not None else set()
        stale |= self._ended_task_vms()
        if stale:
            self._reread(cache, stale)

    def close(self) -> None:
        """Let go of the filters, view and login, as far as vCenter still listens."""
        for release in (self._collector.DestroyPropertyCollector, self._view.DestroyView):
            best_effort(release)
        best_effort(partial(VSphereSession.end_private, self._connection))

    def _wait(self, seconds: int) -> Any:
        options = vmodl.query.PropertyCollector.WaitOptions(
            maxWaitSeconds=seconds, maxObjectUpdates=MAX_OBJECT_UPDATES
        )
        update = self._collector.WaitForUpdatesEx(self._version, options)
        if update is not None:
            self._version = update.version
        return update

    def _apply(self, cache: InventoryCache, update: Any, begun: int) -> set[str]:
        """Keep the VMs that entered, drop those that left; the MoRefs of those that changed."""
        changed: set[str] = set()
        arrived = cache.begin()  # a VM reported gone was gone before this
        for filter_update in update.filterSet or ():
            for change in filter_update.objectSet or ():
                obj = change.obj
                if isinstance(obj, vim.TaskManager):
                    self._note_tasks(change)
                elif change.kind == "enter":
                    row: dict[str, Any] = {item.name: item.val for item in change.changeSet or ()}
                    row["_ref"] = obj
                    cache.keep(vm_entry(row), begun)
                elif change.kind == "leave":
                    cache.drop(str(obj._moId), arrived)
                else:
                    changed.add(str(obj._moId))
        return changed

    def _note_tasks(self, change: Any) -> None:
        """Tasks that appeared in the recent list since the last look are waited on (none at
        the first look: what ran before the feed began is in the view it read)."""
        recent = {
            str(task._moId)
            for item in change.changeSet or ()
            if item.name == "recentTask"
            for task in item.val or ()
        }
        if change.kind != "enter":
            self._waiting_tasks |= recent - self._recent_tasks
        self._recent_tasks = recent

    def _ended_task_vms(self) -> set[str]:
        """The VMs of the waited-on tasks that ended (tasks vCenter forgot are let go)."""
        if not self._waiting_tasks:
            return set()
        tasks = [vim.Task(task, self._connection._stub) for task in self._waiting_tasks]
        rows = _read_each(self._connection, tasks, TASK_PROPERTIES)
        still = set()
        vms = set()
        for row in rows:
            if str(row.get("info.state")) not in ENDED_TASK_STATES:
                still.add(str(row["_ref"]._moId))
            elif isinstance(row.get("info.entity"), vim.VirtualMachine):
                vms.add(str(row["info.entity"]._moId))
        self._waiting_tasks = still
        return vms

    def _reread(self, cache: InventoryCache, morefs: set[str]) -> None:
        begun = cache.begin()
        vms = [vim.VirtualMachine(moref, self._connection._stub) for moref in morefs]
        found = set()
        for row in _read_each(self._connection, vms, VM_PROPERTIES):
            entry = vm_entry(row)
            found.add(entry.moref)
            cache.keep(entry, begun)
        for moref in morefs - found:
            cache.drop(moref, begun)


def _task_filter(task_manager: Any) -> Any:
    return vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=task_manager)],
        propSet=[
            vmodl.query.PropertyCollector.PropertySpec(type=vim.TaskManager, pathSet=["recentTask"])
        ],
    )


def _read_each(
    connection: Connection, objects: Sequence[Any], properties: Sequence[str]
) -> list[dict[str, Any]]:
    """The objects' properties in one read; when one of them is gone (vCenter then fails the
    whole read), one read each, without the missing."""
    together = or_none(partial(retrieve, connection, objects, properties))
    if together is not None:
        return together
    rows: list[dict[str, Any]] = []
    for obj in objects:
        rows.extend(or_none(partial(retrieve, connection, [obj], properties)) or ())
    return rows
