"""The compressed clusters of a qcow2 kept as it is, inflated as their bytes stream past, as
qemu inflates them when the guest reads them.

qemu reads a compressed cluster's descriptor (an L2 entry) as a byte offset and a count of
512-byte sectors; it reads that many bytes (zeros past the file's end) and inflates them as
raw deflate into one cluster: the cluster is read when they fill it (what would follow is never
looked at), and the guest's read fails when they do not (not deflate, or too short). A
conversion by qemu-img reads every cluster, so it refuses such an image; an image kept as it is
gets the same reading here, on the bytes that pass, before it is a disk.

An L2 table names its compressed clusters before their bytes pass when the image is laid out as
qemu-img lays it out (each L2 table ahead of the data it maps). One whose bytes passed before
its descriptor did cannot be read again and is refused, by name. At most MAX_PENDING
descriptors wait for their bytes at once: memory stays bounded whatever the tables claim.
"""

from __future__ import annotations

import heapq
import zlib

from pyrigaud.adapters.disk_images.blocks import SECTOR_BYTES

MAX_PENDING = 1 << 18  # descriptors waiting for their bytes (some 12 MiB at most)
_LENGTH_BITS = 23  # a compressed cluster's byte count is at most two 2 MiB clusters
_RAW_DEFLATE_WINDOW_BITS = -12  # raw deflate with a 4 KiB window, as qemu inflates it


def compressed_span(entry: int, cluster_bits: int) -> tuple[int, int]:
    """A compressed cluster descriptor's (byte offset, byte count), as qemu's
    qcow2_parse_compressed_l2_entry reads it: the offset's bits, then the count of 512-byte
    sectors after the first, less the offset's place in its sector."""
    offset_bits = 62 - (cluster_bits - 8)
    offset = entry & ((1 << offset_bits) - 1)
    sectors = ((entry >> offset_bits) & ((1 << (cluster_bits - 8)) - 1)) + 1
    return offset, sectors * SECTOR_BYTES - offset % SECTOR_BYTES


class CompressedClusters:
    """The compressed clusters named so far, inflated as the image's bytes pass (`passing`);
    `problem` is the first that qemu could not read."""

    def __init__(self, cluster: int) -> None:
        self._cluster = cluster
        self._pending: list[int] = []  # offset << _LENGTH_BITS | length, a heap
        self._inflating: list[_Inflating] = []
        self.problem: str | None = None

    def named(self, offset: int, length: int) -> None:
        """A descriptor read from an L2 table (whose bytes are passing now)."""
        if self.problem is not None:
            return
        if len(self._pending) >= MAX_PENDING:
            self.problem = (
                f"the qcow2 image names more than {MAX_PENDING} compressed clusters ahead of "
                "their bytes, more than are judged at once"
            )
            return
        heapq.heappush(self._pending, offset << _LENGTH_BITS | length)

    def passing(self, at: int, chunk: bytes | memoryview) -> None:
        """The image's bytes from offset `at`, after the tables in them were read."""
        end = at + len(chunk)
        while self.problem is None and self._pending and self._pending[0] >> _LENGTH_BITS < end:
            offset, length = _span(heapq.heappop(self._pending))
            if offset < at:
                self.problem = (
                    f"the qcow2 image's compressed cluster at byte {offset} comes before the "
                    "L2 table that names it: convert it with qemu-img first"
                )
                return
            self._inflating.append(_Inflating(offset, length, self._cluster))
        for cluster in self._inflating:
            if self.problem is None:
                self.problem = cluster.passing(at, chunk)
        self._inflating = [cluster for cluster in self._inflating if not cluster.done]

    def ended(self) -> str | None:
        """The image ended: bytes past its end read as zeros, as qemu reads them."""
        while self.problem is None and self._pending:
            offset, length = _span(heapq.heappop(self._pending))
            self._inflating.append(_Inflating(offset, length, self._cluster))
        for cluster in self._inflating:
            if self.problem is None:
                self.problem = cluster.ended()
        self._inflating = []
        return self.problem


def _span(pending: int) -> tuple[int, int]:
    return pending >> _LENGTH_BITS, pending & ((1 << _LENGTH_BITS) - 1)


class _Inflating:
    """One compressed cluster, `length` bytes from `offset`, inflated as they pass."""

    def __init__(self, offset: int, length: int, cluster: int) -> None:
        self._offset = offset
        self._next = offset
        self._end = offset + length
        self._cluster = cluster
        self._inflater = zlib.decompressobj(_RAW_DEFLATE_WINDOW_BITS)
        self._produced = 0
        self.done = False

    def passing(self, at: int, chunk: bytes | memoryview) -> str | None:
        start, stop = max(self._next, at), min(self._end, at + len(chunk))
        if self.done or start >= stop:
            return None
        self._next = stop
        return self._inflate(chunk[start - at : stop - at])

    def ended(self) -> str | None:
        if self.done:
            return None
        padding = bytes(self._end - self._next)
        self._next = self._end
        return self._inflate(padding)

    def _inflate(self, data: bytes | memoryview) -> str | None:
        try:
            produced = self._inflater.decompress(data, self._cluster - self._produced)
        except zlib.error as error:
            self.done = True
            return (
                f"the qcow2 image's compressed cluster at byte {self._offset} does not inflate "
                f"({error}; qemu fails the read)"
            )
        self._produced += len(produced)
        if self._produced == self._cluster:
            self.done = True  # a whole cluster: what follows is never read
        elif self._next >= self._end:
            return self._short()
        return None

    def _short(self) -> str | None:
        self.done = True
        if self._produced == self._cluster:
            return None
        return (
            f"the qcow2 image's compressed cluster at byte {self._offset} inflates to "
            f"{self._produced} bytes, not a cluster's {self._cluster} (qemu fails the read)"
        )
