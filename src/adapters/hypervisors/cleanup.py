"""Work undone when it fails, whether it returns a Failure or raises on its way to the edge.

Both backends make things in steps (a VM, its disks, a lease, a scratch file) and must take
them away again when a later step fails; these two helpers are the one way they say so, so
what is undone, and when, reads at the call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

from returns.result import Result

from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")


def undone_on_raise(
    work: Callable[[], T],
    undo: Callable[[], object],
    *,
    raised: tuple[type[BaseException], ...] = (BaseException,),
) -> T:
    """`work()`, after `undo` ran if it raised one of `raised` (which then rises on)."""
    with _undone_if_raised(undo, raised):
        return work()


def undone_on_failure(
    work: Callable[[], Result[T, ProviderError]],
    undo: Callable[[], object],
    *,
    raised: tuple[type[BaseException], ...] = (BaseException,),
) -> Result[T, ProviderError]:
    """`work`'s Result, after `undo` ran if it failed: as a Failure, or by raising one of
    `raised`. Making a libvirt VM undoes only libvirt's refusals: a process killed part-way
    (or a bug) leaves the building placeholder that records what to remove, for Delete."""
    with _undone_if_raised(undo, raised):
        done = work()
    return done.alt(partial(_undone, undo))


@contextmanager
def _undone_if_raised(
    undo: Callable[[], object], raised: tuple[type[BaseException], ...]
) -> Iterator[None]:
    """`undo` run when the block raises one of `raised`, which then rises on: a `with` adds
    no frame to the work it guards, so both helpers call the work directly."""
    try:
        yield
    except raised:
        undo()
        raise


def _undone(undo: Callable[[], object], error: ProviderError) -> ProviderError:
    undo()
    return error
