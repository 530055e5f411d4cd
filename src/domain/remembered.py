"""A value derived from a source, remembered per key while the source stays the same.

Describe is asked about every VM every ten seconds and its answer changes only when the VM
does: what the cache holds of a VM is the same object from one event to the next, and so is
what is derived from it (the description, its reply). Deriving it again on every call is most
of what a Describe costs beyond grpcio's own work; remembering it costs a dictionary lookup and
a comparison that the same object passes by identity (an equal one by value, once, after its
source was replaced by an equal one).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

S = TypeVar("S")
D = TypeVar("D")

MAX_KEYS = 65_536  # a provider's VMs, with room: past it, everything is derived afresh


class Remembered(Generic[S, D]):
    """`derive(source)`, remembered per key until the key's source compares unequal: the
    source must be immutable (what was derived from it then still holds). At most `max_keys`
    are held: past them all are forgotten at once (keys of VMs long gone go with them).
    Thread-safe as a dictionary is: two threads may derive the same value at once, harmlessly."""

    def __init__(self, derive: Callable[[S], D], max_keys: int = MAX_KEYS) -> None:
        self._derive = derive
        self._max_keys = max_keys
        self._last: dict[Hashable, tuple[S, D]] = {}

    def __call__(self, key: Hashable, source: S) -> D:
        known = self._last.get(key)
        if known is not None and known[0] == source:  # identity first: no field compared
            return known[1]
        derived = self._derive(source)
        if len(self._last) >= self._max_keys:
            self._last.clear()
        self._last[key] = (source, derived)
        return derived
