"""One persistent libvirt connection per process, shared by threads, reopened when it dies.

libvirt connections are thread-safe for calls; only replacing a dead one needs the lock.
The default event loop runs on a daemon thread so that keepalive and close callbacks work.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import libvirt

from pyrigaud.adapters.hypervisors.libvirt.errors import (
    CONNECTION_LOSS_CODES,
    AdapterError,
    error_code,
)
from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")

# libvirt-python has no type stubs: its objects are Any, and stay inside this package.
VirConnect = Any
Opener = Callable[[str], VirConnect]

KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_COUNT = 3

_process_setup_lock = threading.Lock()
_process_setup_done = False


def prepare_libvirt_for_process() -> None:
    """Silence libvirt's stderr printing and start its event loop, once per process."""
    global _process_setup_done  # noqa: PLW0603 - libvirt's event loop is process-global
    with _process_setup_lock:
        if _process_setup_done:
            return
        libvirt.registerErrorHandler(lambda *_: None, None)
        libvirt.virEventRegisterDefaultImpl()
        thread = threading.Thread(target=_run_event_loop, name="libvirt-events", daemon=True)
        thread.start()
        _process_setup_done = True


def _run_event_loop() -> None:
    while True:
        libvirt.virEventRunDefaultImpl()


class LibvirtConnection:
    """Opens lazily (construction never fails), so an unreachable host is an answer, not a crash."""

    def __init__(self, uri: str, *, opener: Opener = libvirt.open) -> None:
        self.uri = uri
        self._opener = opener
        self._lock = threading.Lock()
        self._conn: VirConnect | None = None

    def call(self, action: Callable[[VirConnect], T]) -> T:
        """Run `action` on the live connection; once more on a fresh one if it died meanwhile."""
        conn = self._current()
        try:
            return action(conn)
        except libvirt.libvirtError as error:
            if error_code(error) not in CONNECTION_LOSS_CODES or _is_alive(conn):
                raise
        return action(self._reopen(conn))

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(libvirt.libvirtError):  # a dead one has nothing to release
                conn.close()

    def _current(self) -> VirConnect:
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
            return self._conn

    def _reopen(self, dead: VirConnect) -> VirConnect:
        with self._lock:
            if self._conn is dead or self._conn is None:
                self._conn = self._open()
            return self._conn

    def _open(self) -> VirConnect:
        prepare_libvirt_for_process()
        try:
            conn = self._opener(self.uri)
        except libvirt.libvirtError as error:
            # Whatever libvirt's code, a host we cannot reach is "unavailable", not bad input.
            message = error.get_error_message() or str(error)
            raise AdapterError(
                ProviderError.unavailable(f"cannot connect to {self.uri}: {message}")
            ) from error
        with contextlib.suppress(libvirt.libvirtError):  # test:// has no keepalive
            conn.setKeepAlive(KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_COUNT)
        return conn


def _is_alive(conn: VirConnect) -> bool:
    try:
        return bool(conn.isAlive())
    except libvirt.libvirtError:
        return False
