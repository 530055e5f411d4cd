"""What Describe and ListVMs show of every VM, kept by vCenter's property-collector updates
(inventory_updates.py) so that, once warm, they answer without a round trip.

What keeps it honest:

- it answers only while warm: from the end of a complete initial update set until the feed
  breaks (a lost session, a failed long-poll), when it goes cold until the feed has read the
  whole view again; cold, or asked about a VM it has never seen, it says "cannot say" (None)
  and the caller reads vCenter as before. Going cold never waits: readers are never blocked,
  save a listing while the feed reads the whole view, which may wait (bounded) for that read
  rather than make a second one of every VM beside it (`entries_once_read`);
- this replica's mutations re-read their VM before their RPC returns (`refresh`), and so does
  TaskStatus when it reports a task done (read your writes);
- a read that raced with a newer one is not kept: every read takes a sequence number before it
  starts, and an entry is replaced only by a read that began later (a VM's removal is dated
  when vCenter's report of it arrived, so no read begun before that brings it back).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from itertools import count
from typing import Any

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import run
from pyrigaud.adapters.hypervisors.vsphere.properties import VM_PROPERTIES
from pyrigaud.adapters.hypervisors.vsphere.vcenter import INSTANCE_UUID, VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import VMEntry, vm_entry
from pyrigaud.domain.errors import ProviderError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class About:
    """The vCenter (or ESXi host) answering: what a console link names, fixed per endpoint."""

    api_type: str
    instance_uuid: str


class InventoryCache:
    """Entries by MoRef, with instanceUuid -> MoRef; written by the update feed and by
    `refresh`, read lock-free (one dict lookup, or one copy of the values)."""

    def __init__(self, vcenter: VCenter) -> None:
        self._vcenter = vcenter
        self._lock = threading.Lock()
        self._sequence = count(1)
        self._entries: dict[str, VMEntry] = {}
        self._morefs: dict[str, str] = {}
        self._read_at: dict[str, int] = {}  # MoRef -> sequence of the read its entry came from
        self._warm = False
        self._settled = threading.Event()  # clear while the feed reads the whole view
        self._doubted = threading.Event()
        self.about: About | None = None

    # -- readers -------------------------------------------------------------------------

    def entry(self, vm_id: str) -> VMEntry | None:
        """The VM's entry; None when the cache cannot say (cold, or a VM it has not seen)."""
        if not self._warm:
            return None
        if INSTANCE_UUID.fullmatch(vm_id):
            moref = self._morefs.get(vm_id.lower())
            return None if moref is None else self._entries.get(moref)
        return self._entries.get(vm_id)

    def entries(self) -> list[VMEntry] | None:
        """Every VM's entry; None while cold."""
        return list(self._entries.values()) if self._warm else None

    def entries_once_read(self, seconds: float) -> list[VMEntry] | None:
        """Every VM's entry; while the feed reads the whole view (a new cache, or one gone
        cold), once it has, waiting at most `seconds`. None when the wait runs out, or when
        the feed broke and reads nothing now."""
        if not self._warm:
            self._settled.wait(seconds)
        return self.entries()

    # -- this replica's writes -----------------------------------------------------------

    def refresh(self, vm_id: str) -> None:
        """Re-read one VM now, through the replica's session (after this replica changed it).
        A read that fails leaves the cache in doubt: cold until the feed has read it all."""
        begun = self.begin()

        def read_row(instance: Any) -> Result[dict[str, Any] | None, ProviderError]:
            return Success(self._vcenter.vm_row(instance, vm_id, VM_PROPERTIES))

        read = run(self._vcenter.session, f"re-reading VM {vm_id!r}", read_row)
        match read:
            case Success(None):
                self.forget(vm_id, begun)
            case Success(row):
                self.keep(vm_entry(row), begun)
            case Failure(error):
                logger.warning("%s; reading vCenter meanwhile", error)
                self.doubt()

    # -- the feed ------------------------------------------------------------------------

    def begin(self) -> int:
        """The sequence number a read takes before it starts."""
        return next(self._sequence)

    def keep(self, entry: VMEntry, begun: int) -> None:
        with self._lock:
            if self._read_at.get(entry.moref, 0) > begun:
                return
            self._read_at[entry.moref] = begun
            old = self._entries.get(entry.moref)
            if old is not None and old.id != entry.id:
                self._morefs.pop(old.id.lower(), None)
            self._entries[entry.moref] = entry
            if INSTANCE_UUID.fullmatch(entry.id):
                self._morefs[entry.id.lower()] = entry.moref

    def drop(self, moref: str, begun: int) -> None:
        with self._lock:
            if self._read_at.get(moref, 0) > begun:
                return
            self._read_at[moref] = begun
            old = self._entries.pop(moref, None)
            if old is not None:
                self._morefs.pop(old.id.lower(), None)

    def forget(self, vm_id: str, begun: int) -> None:
        """Drop the VM an id of either shape names (it is gone)."""
        moref = self._morefs.get(vm_id.lower()) if INSTANCE_UUID.fullmatch(vm_id) else vm_id
        if moref is not None:
            self.drop(moref, begun)

    def go_cold(self) -> None:
        """Stop answering and forget everything: the feed reads the whole view again."""
        with self._lock:
            self._warm = False
            self._entries = {}
            self._morefs = {}
        self._doubted.clear()
        self._settled.clear()

    def go_warm(self) -> None:
        self._warm = True
        self._settled.set()

    def doubt(self) -> None:
        """Stop answering now; the feed resynchronises at its next turn. A listing waiting
        for the feed's read stops waiting and reads vCenter itself."""
        self._warm = False
        self._doubted.set()
        self._settled.set()

    @property
    def doubted(self) -> bool:
        return self._doubted.is_set()
