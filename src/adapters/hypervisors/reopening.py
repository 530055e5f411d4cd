"""A hypervisor handle opened on first use and replaced when found dead or expired.

libvirt connections and vSphere sessions share this shape: every RPC thread uses one handle;
the first caller opens it, and when a call finds it dead, exactly one replacement is opened
however many callers noticed at once (the others take the replacement).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

Handle = TypeVar("Handle")


class Reopening(Generic[Handle]):
    """Thread-safe lazy handle; `open` runs under the lock, so it is never run twice at once."""

    def __init__(self, open_handle: Callable[[], Handle]) -> None:
        self._open = open_handle
        self._lock = threading.Lock()
        self._handle: Handle | None = None

    def current(self) -> Handle:
        """The open handle, opened now if there is none."""
        with self._lock:
            if self._handle is None:
                self._handle = self._open()
            return self._handle

    def replace(self, stale: Handle) -> tuple[Handle, bool]:
        """A handle other than `stale`, and whether this call is the one that replaced it."""
        with self._lock:
            replaced = self._handle is stale
            if replaced or self._handle is None:
                self._handle = self._open()
            return self._handle, replaced

    def take(self) -> Handle | None:
        """Let go of the handle (the caller closes it); the next use opens a new one."""
        with self._lock:
            handle, self._handle = self._handle, None
            return handle
