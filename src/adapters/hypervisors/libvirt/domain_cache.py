"""What Describe and ListVMs show of each domain, kept current by libvirt's domain events.

Describe then costs a dictionary lookup and never waits on a guest. What keeps it honest:

- an event about a domain, from whichever connection caused it (another replica, virsh, the
  guest itself), drops that domain's view; the next read loads it afresh;
- this replica's own mutations drop the view before their RPC returns (read your writes);
- a load that raced with a drop is not kept: every load takes a sequence number before it
  reads, and a drop bumps it;
- a new connection (a reconnect) drops everything and registers the callbacks again, and a
  connection that cannot deliver events, or is no longer alive, is never cached for (libvirt
  takes one callback per event and connection, so a second cache on one connection is such);
- guest addresses, the one read that can wait on a guest agent, are refreshed by one background
  thread, a bounded batch per tick, oldest first; reads show the last ones known.

The same thread fills the cache once per new connection (a listing), then completes the live
side and the addresses of running domains batch by batch, so that Describe and ListVMs after a
start or a reconnect soon find it warm without the background work crowding them out.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import libvirt

from pyrigaud.adapters.hypervisors.libvirt.calls import ANY_CODE, best_effort, refusal
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DomainFacts, parse_domain
from pyrigaud.application.ports.clock import Clock

VirDomain = Any
AddressReader = Callable[[VirDomain], tuple[str, ...]]
WarmUp = Callable[[VirConnect], object]

logger = logging.getLogger(__name__)

# "On": the guest runs. A domain shutting down still does (QEMU flushes and holds its disks
# until it exits), so a graceful shutdown is done, and Off shows, only once it has stopped.
RUNNING_STATES = frozenset(
    {libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED, libvirt.VIR_DOMAIN_SHUTDOWN}
)

# Without these a view could go stale unnoticed, so a connection that lacks one is not cached for.
REQUIRED_EVENTS = (
    libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
    libvirt.VIR_DOMAIN_EVENT_ID_METADATA_CHANGE,
    libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_ADDED,
    libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
    libvirt.VIR_DOMAIN_EVENT_ID_TUNABLE,
)
# Hints that addresses changed: welcome where the driver has them, not needed for correctness.
ADDRESS_HINT_EVENTS = (
    libvirt.VIR_DOMAIN_EVENT_ID_REBOOT,
    libvirt.VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE,
)
# A new boot, or none: the guest's addresses from before mean nothing now.
NEW_BOOT_EVENTS = frozenset(
    {
        libvirt.VIR_DOMAIN_EVENT_STARTED,
        libvirt.VIR_DOMAIN_EVENT_STOPPED,
        libvirt.VIR_DOMAIN_EVENT_CRASHED,
        libvirt.VIR_DOMAIN_EVENT_UNDEFINED,
    }
)

TICK_SECONDS = 1.0
REFRESHES_PER_TICK = 128  # a few percent of a core on the test driver, I/O waits on a remote
ADDRESS_MAX_AGE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class DomainView:
    """One domain as last read: its state and definitions."""

    state: int
    facts: DomainFacts  # the persistent definition: what the VM is and will be after a boot
    live: DomainFacts | None  # the running definition (VNC port, live CPU); None: not read yet

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES


@dataclass(frozen=True, slots=True)
class _Addresses:
    ips: tuple[str, ...]
    read_at: float
    begun: int  # the sequence number its read began at
    wanted: bool = False  # a hint said they changed: read them at the next tick


def read_view(dom: VirDomain, *, with_live: bool = True) -> DomainView:
    """A domain's view from libvirt; its running definition only when asked for."""
    state = int(dom.state()[0])
    facts = parse_domain(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    live = None
    if with_live and state != libvirt.VIR_DOMAIN_SHUTOFF:
        live = parse_domain(dom.XMLDesc(0))
        if live == facts:  # the usual case: keep one copy (10,000s of domains add up)
            live = facts
    return listed_view(state, facts, live)


def listed_view(state: int, facts: DomainFacts, live: DomainFacts | None = None) -> DomainView:
    """A view from what a listing read; a shut-off domain runs nothing but its definition."""
    return DomainView(state, facts, facts if state == libvirt.VIR_DOMAIN_SHUTOFF else live)


class DomainCache:
    """Thread-safe: request threads read and load, libvirt's event thread drops, one thread
    fills and refreshes. Keyed by lower-case UUID, as libvirt spells it."""

    def __init__(
        self,
        read_addresses: AddressReader,
        *,
        clock: Clock,
        warm_up: WarmUp = lambda _conn: None,
        tick_seconds: float = TICK_SECONDS,
        refreshes_per_tick: int = REFRESHES_PER_TICK,
        address_max_age_seconds: float = ADDRESS_MAX_AGE_SECONDS,
        on_resync: Callable[[], None] = lambda: None,
    ) -> None:
        """`read_addresses` may block on a guest agent: only the refresher and a first read
        of a domain never seen running call it. `warm_up` reads every domain through the
        cache (a listing that gives up if `claim_warm_up` says another listing came first); the
        background thread runs it once per new connection. `on_resync` is told each time the
        cache starts afresh on a new connection after an earlier one fed it events: their feed
        broke (the connection died or was replaced), and everything is read again (a metric).
        `clock` ages the addresses read."""
        self._read_addresses = read_addresses
        self._clock = clock
        self._warm_up = warm_up
        self._cold: VirConnect | None = None  # a new connection no listing has read yet
        # The connection the refresher last filled for, weakly: it must not keep a closed one.
        self._filled: weakref.ref[VirConnect] | None = None
        self._tick_seconds = tick_seconds
        self._refreshes_per_tick = refreshes_per_tick
        self._address_max_age = address_max_age_seconds
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._conn: VirConnect | None = None
        self._callback_ids: list[int] = []
        self._caching = False  # events arrive from self._conn: views may be kept
        self._fed_before = False  # some connection has fed this cache events
        self._on_resync = on_resync
        self._views: dict[str, DomainView] = {}
        self._addresses: dict[str, _Addresses] = {}
        self._sequence = 0
        self._reset_at = 0
        self._dropped_at: dict[str, int] = {}  # drops that loads in flight must know about
        self._loads: Counter[int] = Counter()  # loads in flight, by the sequence they began at
        self._refresher: threading.Thread | None = None

    # --- the connection ---------------------------------------------------------------------

    def attach(self, conn: VirConnect) -> None:
        """Called with the live connection on every read: a new one (a reconnect) gets the
        callbacks and an empty cache; a dead one stops caching until it is replaced."""
        if conn is self._conn:
            if self._caching and not _is_alive(conn):
                self.detach(conn)
            return
        with self._lock:
            if conn is self._conn:
                return
            old, old_ids = self._conn, self._callback_ids
            self._conn, self._callback_ids, self._caching = conn, [], False
            self._reset_locked()
        if old is not None:
            _deregister(old, old_ids)
        ids = self._register(conn)
        resynced = False
        with self._lock:
            current = self._conn is conn
            if current:
                self._callback_ids = ids or []
                self._caching = ids is not None
                self._reset_locked()  # what was loaded while registering may have missed events
                self._cold = conn if self._caching else None
                resynced = self._caching and self._fed_before
                self._fed_before = self._fed_before or self._caching
        if not current and ids:  # replaced meanwhile: its successor registers itself
            _deregister(conn, ids)
        if resynced:
            self._on_resync()
        self._start_refresher()
        self._wake.set()

    def detach(self, conn: VirConnect) -> None:
        """Stop caching for `conn` and deregister its callbacks: when it is dead, or about to
        be closed (the connection's close hook), after which they could not be removed."""
        with self._lock:
            if self._conn is not conn:
                return
            ids, self._callback_ids = self._callback_ids, []
            self._conn, self._caching, self._cold = None, False, None
            self._reset_locked()
        _deregister(conn, ids)

    def _register(self, conn: VirConnect) -> list[int] | None:
        ids: list[int] = []
        for event in REQUIRED_EVENTS:
            registered = best_effort(partial(self._registered, conn, event))
            if registered is None:
                _deregister(conn, ids)
                return None
            ids.append(registered)
        for event in ADDRESS_HINT_EVENTS:
            hinted = best_effort(partial(self._registered, conn, event))
            if hinted is not None:
                ids.append(hinted)
        return ids

    def _registered(self, conn: VirConnect, event: int) -> int:
        return int(conn.domainEventRegisterAny(None, event, self._callback(event), None))

    def _callback(self, event: int) -> Callable[..., None]:
        """libvirt passes (conn, dom, *details, opaque); only the lifecycle kind matters here.

        It holds the cache weakly: libvirt keeps callbacks of a connection closed without
        deregistering them, and they must not keep a forgotten backend alive.
        """
        cache_ref = weakref.ref(self)

        def on_event(_conn: VirConnect, dom: VirDomain, *details: Any) -> None:
            cache = cache_ref()
            if cache is None:
                return
            vm_id = str(dom.UUIDString())
            if event == libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE:
                cache.forget(vm_id, new_boot=details[0] in NEW_BOOT_EVENTS)
            elif event in ADDRESS_HINT_EVENTS:
                cache._want_addresses(vm_id)
            else:
                cache.forget(vm_id)

        return on_event

    # --- views ------------------------------------------------------------------------------

    def view(self, vm_id: str) -> DomainView | None:
        """The cached view, or None: then the caller reads libvirt and may `keep` what it read."""
        return self._views.get(vm_id.lower()) if self._caching else None

    def hit(self, vm_id: str) -> tuple[DomainView, tuple[str, ...]] | None:
        """All Describe shows of `vm_id` when the cache holds it, read without the connection:
        the view with its running definition, and the guest's last addresses (none when it
        is not running). None sends the caller through the connection (`attach`, `view`),
        which also stops caching for a connection found dead here."""
        conn = self._conn
        if not self._caching or conn is None or not _is_alive(conn):
            return None
        key = vm_id.lower()
        view = self._views.get(key)
        if view is None or view.live is None:
            return None
        if view.state not in RUNNING_STATES:
            return view, ()
        known = self._addresses.get(view.facts.uuid.lower())
        return (view, known.ips) if known is not None else None

    @contextlib.contextmanager
    def loading(self) -> Iterator[Load]:
        """A load: what is read inside may be kept through the yielded Load, unless the
        domain was dropped (or the cache reset) after the load began."""
        with self._lock:
            load = Load(self, self._sequence)
            self._loads[load.begun] += 1
        try:
            yield load
        finally:
            with self._lock:
                self._loads[load.begun] -= 1
                if not self._loads[load.begun]:
                    del self._loads[load.begun]
                oldest = min(self._loads, default=self._sequence)
                self._dropped_at = {k: s for k, s in self._dropped_at.items() if s > oldest}

    def forget(self, vm_id: str, *, new_boot: bool = False) -> None:
        """Read it afresh next time (after a mutation, or an event); `new_boot` also drops
        the guest's addresses."""
        vm_id = vm_id.lower()
        with self._lock:
            self._sequence += 1
            self._views.pop(vm_id, None)
            if self._loads:
                self._dropped_at[vm_id] = self._sequence
            if new_boot:
                self._addresses.pop(vm_id, None)

    def _keep_addresses_of(self, begun: int, vm_ids: set[str]) -> None:
        with self._lock:
            for gone in self._addresses.keys() - vm_ids:
                if self._addresses[gone].begun < begun:  # read before the listing: it is gone
                    del self._addresses[gone]

    def _is_current(self, vm_id: str, begun: int) -> bool:
        """Held under the lock: nothing dropped `vm_id` since `begun`."""
        return self._caching and begun >= self._reset_at and self._dropped_at.get(vm_id, 0) <= begun

    def _keep_view(self, vm_id: str, begun: int, view: DomainView) -> None:
        """Both are current if one is already there: the one that knows the live side wins."""
        with self._lock:
            if self._is_current(vm_id, begun) and (
                view.live is not None or vm_id not in self._views
            ):
                self._views[vm_id] = view

    def _keep_addresses(self, vm_id: str, begun: int, ips: tuple[str, ...]) -> None:
        with self._lock:
            if self._is_current(vm_id, begun):
                self._addresses[vm_id] = _Addresses(ips, self._clock.monotonic(), begun)

    def _reset_locked(self) -> None:
        self._sequence += 1
        self._reset_at = self._sequence
        self._views.clear()
        self._dropped_at.clear()

    # --- addresses --------------------------------------------------------------------------

    def addresses(self, vm_id: str) -> tuple[str, ...] | None:
        """The last addresses read, or None when never read since the domain last started
        (or when nothing is cached: without events nobody knows when they went stale)."""
        if not self._caching:
            return None
        known = self._addresses.get(vm_id.lower())
        return known.ips if known is not None else None

    def read_addresses(self, vm_id: str, dom: VirDomain) -> tuple[str, ...]:
        """Read now and remember: the refresher's way, and a first read's of a running domain."""
        with self.loading() as load:
            ips = self._read_addresses(dom)
            load.keep_addresses(vm_id, ips)
        return ips

    def _want_addresses(self, vm_id: str) -> None:
        with self._lock:
            known = self._addresses.get(vm_id)
            if known is not None:
                self._addresses[vm_id] = _Addresses(
                    known.ips, known.read_at, known.begun, wanted=True
                )
        self._wake.set()

    def _due(self, limit: int) -> list[str]:
        """Running domains that lack their live side or whose addresses are missing, wanted
        or oldest: those first, then by age; at most `limit`."""
        now = self._clock.monotonic()
        with self._lock:
            if not self._caching:
                return []
            due = []
            for vm_id, view in self._views.items():
                if not view.running:
                    continue
                known = self._addresses.get(vm_id)
                if view.live is None or known is None or known.wanted:
                    due.append((0.0, vm_id))
                elif now - known.read_at >= self._address_max_age:
                    due.append((known.read_at, vm_id))
        due.sort()
        return [vm_id for _, vm_id in due[:limit]]

    def claim_warm_up(self, conn: VirConnect) -> bool:
        """Every full listing claims it: True for the first one on a new connection."""
        with self._lock:
            cold = self._cold is conn
            if cold:
                self._cold = None
            return cold

    def _tick(self) -> None:
        """One round of background work: a new connection's cache is filled by a listing;
        then each tick completes or refreshes one batch of running domains."""
        conn = self._conn
        if conn is None or not self._caching:
            return
        if self._filled is None or self._filled() is not conn:
            self._filled = weakref.ref(conn)
            refused = refusal(lambda: self._warm_up(conn), ANY_CODE)
            if refused is not None:  # Describe and ListVMs then load themselves
                logger.warning("could not fill the domain cache: %s", refused.message)
        for vm_id in self._due(self._refreshes_per_tick):
            if refusal(partial(self._refresh, conn, vm_id), ANY_CODE) is not None:
                self.forget(vm_id)  # gone, or the connection is: the next read finds out

    def _refresh(self, conn: VirConnect, vm_id: str) -> None:
        view = self._views.get(vm_id)
        if view is None:  # dropped since: whoever reads it next loads it
            return
        dom = conn.lookupByUUIDString(vm_id)
        if view.live is None:
            with self.loading() as load:
                view = read_view(dom)
                load.keep_view(vm_id, view)
        if view.running:
            self.read_addresses(vm_id, dom)

    def _start_refresher(self) -> None:
        with self._lock:
            if self._refresher is not None and self._refresher.is_alive():
                return
            self._refresher = threading.Thread(
                target=_refresh_while_used,
                args=(weakref.ref(self), self._wake, self._tick_seconds),
                name="libvirt-domain-cache",
                daemon=True,
            )
            _REFRESHERS[self._refresher] = self._wake
            self._refresher.start()


@dataclass(frozen=True)
class Load:
    """One load in flight, begun at a sequence number of its cache."""

    cache: DomainCache
    begun: int

    def keep_view(self, vm_id: str, view: DomainView) -> None:
        self.cache._keep_view(vm_id, self.begun, view)

    def keep_addresses(self, vm_id: str, ips: tuple[str, ...]) -> None:
        self.cache._keep_addresses(vm_id, self.begun, ips)

    def keep_addresses_of(self, vm_ids: set[str]) -> None:
        """For a full listing: the addresses of domains it did not find are dropped (they went
        while no events came: the connection was down; their views went with the reconnect)."""
        self.cache._keep_addresses_of(self.begun, vm_ids)


# Each running refresher and what wakes it; the exit stops them all.
_REFRESHERS: weakref.WeakKeyDictionary[threading.Thread, threading.Event] = (
    weakref.WeakKeyDictionary()
)
_EXITING = threading.Event()
EXIT_WAIT_SECONDS = 10.0  # a tick's libvirt calls in flight; past that, the exit goes on


@atexit.register
def _stop_refreshers() -> None:
    """At exit, before the interpreter (and libvirt's client in it) is torn down, the refreshers
    stop: one still inside a libvirt call then (a guest's addresses) crashed the process."""
    _EXITING.set()
    for thread, wake in list(_REFRESHERS.items()):
        wake.set()
        thread.join(EXIT_WAIT_SECONDS)


def _refresh_while_used(
    cache_ref: weakref.ref[DomainCache], wake: threading.Event, tick_seconds: float
) -> None:
    """The refresher holds its cache weakly, so a backend nobody uses takes its thread along;
    the process's exit stops it too."""
    while True:
        wake.wait(tick_seconds)
        wake.clear()
        cache = cache_ref()
        if cache is None or _EXITING.is_set():
            return
        try:
            cache._tick()
        except Exception:  # a bug: say so, and keep refreshing
            logger.exception("the domain cache's background work failed")
        del cache


def _deregister(conn: VirConnect, ids: list[int]) -> None:
    for callback_id in ids:
        best_effort(partial(conn.domainEventDeregisterAny, callback_id))  # none left if closed


def _is_alive(conn: VirConnect) -> bool:
    """A local check (no round trip); a closed connection raises."""
    return bool(best_effort(conn.isAlive))
