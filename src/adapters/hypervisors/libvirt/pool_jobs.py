"""Volume builds and pool refreshes in one storage pool, kept apart within this process.

libvirtd refuses to refresh a pool while a volume of it is being built (virStoragePoolRefresh
answers "pool ... has asynchronous jobs running" while any createXML or createXMLFrom of it is
under way, or a volume stream of it is being opened), and a refused refresh leaves the pool's
view of every volume as it was: an image just uploaded into a raw placeholder still reads as
raw. With many transfers into one pool at once, some build is almost always under way, so a
landing that refreshed and read its volume's format back answered a transient state as an
unsupported pool.

Here, per pool, builds (and stream openings, which libvirtd counts alike) share and a refresh
excludes: a refresh waits until this process's builds in the pool are done, and builds asked
for meanwhile wait until it is (the refresh goes first, so a steady flow of builds cannot
starve it). What is read back under `refreshing` is
the pool's view after a refresh no build of this process could refuse; another libvirt client's
build still can, and says so.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

VirStoragePool = Any


class _BuildsOrRefresh:
    """A pool's builds (any number at once) or one refresh, the waiting refresh first."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._builds = 0
        self._refreshing = False
        self._refreshes_waiting = 0

    def _may_build(self) -> bool:
        """No refresh runs, and none waits (a waiting refresh goes first)."""
        return not self._refreshing and not self._refreshes_waiting

    def _may_refresh(self) -> bool:
        """No refresh runs, and no build."""
        return not self._refreshing and not self._builds

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(self._may_build)
            self._builds += 1
        try:
            yield
        finally:
            with self._changed:
                self._builds -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def refreshing(self) -> Iterator[None]:
        with self._changed:
            self._refreshes_waiting += 1
            self._changed.wait_for(self._may_refresh)
            self._refreshes_waiting -= 1
            self._refreshing = True
        try:
            yield
        finally:
            with self._changed:
                self._refreshing = False
                self._changed.notify_all()


_registry_lock = threading.Lock()
_by_pool: dict[str, _BuildsOrRefresh] = {}


def _jobs_of(pool: VirStoragePool) -> _BuildsOrRefresh:
    """The pool's jobs, by its UUID (a pool's name may be reused by another pool later)."""
    key = str(pool.UUIDString())
    with _registry_lock:
        jobs = _by_pool.get(key)
        if jobs is None:  # made once per pool, not on every lookup
            jobs = _by_pool[key] = _BuildsOrRefresh()
        return jobs


def building_in(pool: VirStoragePool) -> contextlib.AbstractContextManager[None]:
    """Held while a volume of `pool` is made (createXML, createXMLFrom)."""
    return _jobs_of(pool).building()


def refreshing(pool: VirStoragePool) -> contextlib.AbstractContextManager[None]:
    """Held while `pool` is refreshed and what the refresh found is read."""
    return _jobs_of(pool).refreshing()
