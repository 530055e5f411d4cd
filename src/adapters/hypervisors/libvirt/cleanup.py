"""Work undone when it fails: whether it returns a Failure or raises on its way to the edge."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from returns.result import Result

from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")


def undone_on_failure(
    work: Callable[[], Result[T, ProviderError]],
    undo: Callable[[], object],
    *,
    raised: tuple[type[BaseException], ...] = (BaseException,),
) -> Result[T, ProviderError]:
    """`work`'s Result, after `undo` ran if it failed: as a Failure, or by raising one of
    `raised`. Making a VM undoes only libvirt's refusals: a process killed part-way (or a bug)
    leaves the building placeholder that records what to remove, for Delete."""
    try:
        done = work()
    except raised:
        undo()
        raise
    return done.alt(lambda error: _undone(undo, error))


def _undone(undo: Callable[[], object], error: ProviderError) -> ProviderError:
    undo()
    return error
