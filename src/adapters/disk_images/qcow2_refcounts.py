"""The refcounts of a qcow2 kept as it is, counted against its tables as the bytes stream past,
as `qemu-img check` counts them for an image without internal snapshots.

qemu-img check counts a reference for every cluster in use: the header's, the L1 table's, the
refcount table's, each L2 table and refcount block, each data cluster (a zero cluster with an
offset too) and each cluster a compressed cluster's bytes touch. A cluster whose refcount is
below its references is corrupt (the guest's next write would reuse a live cluster); one above
is a leak, which is no harm. An L1 or L2 entry flagged copied must have refcount exactly one,
one not flagged (a compressed cluster aside) must not; a refcount block's cluster is referenced
by nothing else. (The tables of persistent bitmaps are not counted: an uncounted reference can
only hide a corruption, never invent one.)

The judge sees the bytes once, in order, and the refcounts may pass before or after the
clusters they count, so both go into one balance per cluster (refcount less references) and
a few flag bits per cluster, compared once the last byte passed: 5 bytes per cluster, for at
most MAX_CLUSTERS clusters (40 MiB). Only an image whose file has fewer clusters (or, when
its size is not known ahead, whose disk has at most half as many) is kept as it is
(`countable_disk`; any other is converted by qemu-img), and one of them that uses a cluster
past MAX_CLUSTERS anyway is refused. The refcounts of a refcount
block that passes before the refcount table names it (qemu moves a full refcount table after
its blocks) cannot be read again: those clusters' refcounts are not compared.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

MAX_CLUSTERS = 8 * 1024 * 1024
# A refcount above this counts as this much: more references than that are never counted.
_REFCOUNT_CEILING = 1 << 30
# Flag bits per cluster.
_REFERENCED = 1  # any reference counted
_SHARED = 2  # more than one reference counted
_COPIED_REFERENCE = 4  # an L1 or L2 entry flagged copied refers to it
_PLAIN_REFERENCE = 8  # an L1 or L2 entry not flagged copied (nor compressed) refers to it
_REFCOUNT_BLOCK = 16  # a refcount block lies in it
_REFCOUNT_ONE = 32  # its refcount is exactly one


def countable_disk(virtual_bytes: int, file_bytes: int | None, cluster_bits: int) -> bool:
    """Whether a plain qcow2 of this disk size (and file size, when known) is sure to have
    its refcounts counted here: its file's clusters (a cluster in use a cluster or more past
    its end is refused anyway) or, of a file of unknown size, its disk's clusters and its
    tables' well within MAX_CLUSTERS."""
    if file_bytes is not None:
        return file_bytes >> cluster_bits < MAX_CLUSTERS
    return virtual_bytes >> cluster_bits <= MAX_CLUSTERS // 2


def _flags_verdicts() -> bytes:
    """For each byte of flags: 0, or the number of the problem it shows (see _PROBLEMS)."""
    verdicts = bytearray(256)
    for flags in range(256):
        if flags & _COPIED_REFERENCE and not flags & _REFCOUNT_ONE:
            verdicts[flags] = 1
        elif flags & _PLAIN_REFERENCE and flags & _REFCOUNT_ONE:
            verdicts[flags] = 2
        elif flags & _REFCOUNT_BLOCK and flags & _SHARED:
            verdicts[flags] = 3
    return bytes(verdicts)


_FLAGS_VERDICTS = _flags_verdicts()
_PROBLEMS = {
    1: "is flagged copied but its refcount is not one",
    2: "is not flagged copied but its refcount is one",
    3: "holds a refcount block and something else",
}


class RefcountBalance:
    """References and refcounts of one image's clusters (of 2^cluster_bits bytes), counted in
    any order; `problem` once all were counted."""

    def __init__(self, cluster_bits: int) -> None:
        self._cluster_bits = cluster_bits
        self._balance = array("i")  # refcount less references, per cluster
        self._flags = bytearray()
        self.countable = True  # False: a cluster in use past MAX_CLUSTERS
        self._unknown: list[tuple[int, int]] = []  # clusters whose refcounts passed unread

    def referenced(self, offset: int, length: int, copied: bool | None = None) -> None:
        """A reference to every cluster of the `length` bytes at `offset`; `copied`: whether
        the L1 or L2 entry making it is flagged copied (None: no entry, or a compressed one)."""
        if length <= 0:
            return
        first = offset >> self._cluster_bits
        last = (offset + length - 1) >> self._cluster_bits
        if not self._holds(last):
            return
        balance, flags = self._balance, self._flags
        entry_flag = 0 if copied is None else _COPIED_REFERENCE if copied else _PLAIN_REFERENCE
        for cluster in range(first, last + 1):
            balance[cluster] -= 1
            seen = flags[cluster]
            shared = _SHARED if seen & _REFERENCED else 0
            flags[cluster] = seen | _REFERENCED | entry_flag | shared

    def refcount_block(self, offset: int) -> None:
        """The cluster at `offset` holds a refcount block (its reference is counted too)."""
        self.referenced(offset, 1)
        cluster = offset >> self._cluster_bits
        if self.countable:
            self._flags[cluster] |= _REFCOUNT_BLOCK

    def refcounts(self, first_cluster: int, counts: Sequence[int]) -> None:
        """The refcounts of the clusters from `first_cluster` on, as a refcount block says."""
        if not self.countable:
            return
        balance, flags = self._balance, self._flags
        for cluster, count in enumerate(counts, first_cluster):
            if not count:
                continue
            if cluster >= MAX_CLUSTERS:
                return  # no reference reaches it but one that makes the image uncounted
            if cluster >= len(flags):
                self._holds(cluster)
            balance[cluster] += min(count, _REFCOUNT_CEILING)
            if count == 1:
                flags[cluster] |= _REFCOUNT_ONE

    def unknown(self, first_cluster: int, clusters: int) -> None:
        """The refcounts of these clusters passed before they were known to be refcounts (a
        refcount block before the refcount table naming it): they are not compared."""
        self._unknown.append((first_cluster, first_cluster + clusters))

    def problem(self) -> str | None:
        """Once every reference and refcount was counted: the first cluster qemu-img check finds
        corrupt, or None."""
        if not self.countable:
            return (
                f"the qcow2 image uses a cluster past its {MAX_CLUSTERS}th, more than are "
                "counted here for a disk of its size (qemu-img writes no such image)"
            )
        for first, past in self._unknown:
            end = min(past, len(self._flags))
            if first < end:
                self._balance[first:end] = array("i", bytes(4 * (end - first)))
                self._flags[first:end] = bytes(end - first)
        if self._balance and min(self._balance) < 0:
            cluster = self._balance.index(min(self._balance))
            return (
                f"the qcow2 image's cluster {cluster} has a refcount below its references "
                "(qemu-img check finds it corrupt)"
            )
        flagged = self._flags.translate(_FLAGS_VERDICTS)
        cluster = len(flagged) - len(flagged.lstrip(b"\0"))
        if cluster == len(flagged):
            return None
        return (
            f"the qcow2 image's cluster {cluster} {_PROBLEMS[flagged[cluster]]} "
            "(qemu-img check finds it corrupt)"
        )

    def _holds(self, cluster: int) -> bool:
        """Make room for the clusters up to `cluster`; False past MAX_CLUSTERS (then nothing
        more is counted)."""
        if cluster >= MAX_CLUSTERS:
            self.countable = False
        if not self.countable:
            return False
        missing = cluster + 1 - len(self._flags)
        if missing > 0:
            self._flags.extend(bytes(missing))
            self._balance.extend(array("i", bytes(4 * missing)))
        return True
