"""Calls started together, as a manager migrating many VMs starts their transfers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def all_at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Each call's answer, in order, the calls started together on threads of their own
    (behind a barrier: none begins before every thread is ready)."""
    start = threading.Barrier(len(calls))

    def started(call: Callable[[], T]) -> T:
        start.wait()
        return call()

    with ThreadPoolExecutor(max_workers=len(calls)) as threads:
        return list(threads.map(started, calls))


def holds(disk: bytes, expected: bytes) -> bool:
    """The disk is `expected`, then zeros at most (a disk rounds its size up)."""
    return disk[: len(expected)] == expected and not disk[len(expected) :].strip(b"\0")
