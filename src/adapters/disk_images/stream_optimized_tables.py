"""A streamOptimized vmdk's grain directory and grain tables, held against its grain markers as
the bytes stream past: qemu places each grain by the tables (block/vmdk.c reads the grain at
the sector a table entry names), the export and VMware by the markers' sectors. An image whose
tables place a grain otherwise than its marker says, name a grain that is not there, or leave
one out, is read as two different disks; the judge refuses it.

Neither side is held whole: each is folded into one number as it passes, a sum over its
(grain, sector) pairs of r^grain * (k1 * sector + k2) modulo a 127-bit prime, with r, k1 and k2
drawn afresh for every image. The two sums agree when the pairs do; pairs that differ make them
agree by chance with a probability under 2^-80 for any disk the judge takes, and the bytes
cannot aim at numbers they never see. A grain table's entries are folded as its bytes pass,
with r^entry; the directory, when it passes, raises each table's sum to its first grain. Where
the tables lie is known two ways: a directory the header places is read when it passes (qemu-img
writes it, then its tables, before the grains), and tables framed by grain table markers are
folded at once (VMware writes them after their grains, the directory and a footer naming it
last).
"""

from __future__ import annotations

import bisect
import secrets
import struct
from array import array

from pyrigaud.adapters.disk_images.blocks import SECTOR_BYTES

_PRIME = (1 << 127) - 1
_ENTRY = struct.Struct("<I")
_LOW = (1 << 32) - 1
_LOW_64 = (1 << 64) - 1
MAX_TABLE_ENTRIES = 512  # qemu's bound on a grain table (numGTEsPerGT)
MAX_DIRECTORY_BYTES = 8 * 1024 * 1024  # 2^21 tables of 512 grains of 64 KiB: 64 TiB
MARKER_GT, MARKER_GD = 1, 2


class TableAgreement:
    """One stream's grain markers and grain tables, folded as they pass (see the module)."""

    def __init__(self, grains: int, table_entries: int, directory_sector: int | None) -> None:
        """For a disk of `grains` grains, `table_entries` to a grain table, whose header places
        its grain directory at `directory_sector` (None: a footer will)."""
        self._table_entries = table_entries
        self._tables = -(-grains // table_entries)
        self._r = 2 + secrets.randbelow(_PRIME - 3)
        self._k1 = 1 + secrets.randbelow(_PRIME - 1)
        self._k2 = 1 + secrets.randbelow(_PRIME - 1)
        self._powers = [pow(self._r, entry, _PRIME) for entry in range(table_entries)]
        self._markers = 0  # the grain markers' sum
        self._named = 0  # the tables' sum, as the directory raised them
        self._directory_sector = directory_sector  # None: a footer will say
        # The framed tables, in the stream's order: their sectors and sums (two 64-bit halves).
        self._framed_sectors = array("Q")
        self._framed_high = array("Q")
        self._framed_low = array("Q")
        self._candidate: tuple[int, int] | None = None  # a framed directory: sector, its sum
        # Tables the directory named, not passed yet: sector << 32 | table number, in order.
        self._pending = array("Q")
        self._next_pending = 0
        self._folding: list[_Folding] = []
        self._directory: _Folding | None = None
        self._record: _Folding | None = None  # the framed table or directory passing
        self.problem: str | None = None

    def grain(self, grain: int, sector: int) -> None:
        """A grain marker at `sector` holds the disk's `grain`."""
        self._markers = (self._markers + pow(self._r, grain, _PRIME) * self._value(sector)) % _PRIME

    def framed(self, kind: int, record: int, offset: int, data: bytes) -> None:
        """Bytes from `offset` that a grain table (`kind` MARKER_GT) or grain directory
        (MARKER_GD) marker at byte `record` frames; what follows the table or directory is
        not looked at."""
        if self.problem is not None:
            return
        if self._record is None or self._record.start != record + SECTOR_BYTES:
            wanted = (self._table_entries if kind == MARKER_GT else self._tables) * _ENTRY.size
            if wanted > MAX_DIRECTORY_BYTES:
                self._refuse("the vmdk's grain directory is larger than is judged")
                return
            self._record = _Folding(record + SECTOR_BYTES, wanted, table=kind)
        if not self._record.reach(offset, data):
            return
        sector = self._record.start // SECTOR_BYTES
        if kind == MARKER_GT:
            self._framed_table(sector, self._record.taken())
        else:
            self._framed_directory(sector, self._record.taken())

    def _framed_table(self, sector: int, data: bytes) -> None:
        if len(self._framed_sectors) >= self._tables:
            self._refuse("the vmdk has more grain tables than its disk needs")
            return
        table_sum = self._table_sum(data)
        self._framed_sectors.append(sector)
        self._framed_high.append(table_sum >> 64)
        self._framed_low.append(table_sum & _LOW_64)

    def _framed_sum(self, sector: int) -> int | None:
        """The sum of the table a grain table marker framed at `sector`, or None."""
        index = bisect.bisect_left(self._framed_sectors, sector)
        if index == len(self._framed_sectors) or self._framed_sectors[index] != sector:
            return None
        return self._framed_high[index] << 64 | self._framed_low[index]

    def _framed_directory(self, sector: int, data: bytes) -> None:
        """The directory a footer will name, when the header does not place it."""
        if self._directory_sector is not None or self._candidate is not None:
            return
        total = 0
        for table, (table_sector,) in enumerate(self._directory_entries(data)):
            if table_sector:
                table_sum = self._framed_sum(table_sector)
                if table_sum is None:
                    self._refuse(
                        f"the vmdk's grain directory names sector {table_sector}, where no grain "
                        "table marker put a table (qemu would read a table there)"
                    )
                    return
                total += self._raised(table, table_sum)
        self._candidate = sector, total % _PRIME

    def passing(self, offset: int, data: bytes) -> None:
        """Any of the image's bytes from `offset` (a table the directory names may be in the
        header's overhead, unframed)."""
        if self.problem is not None or self._directory_sector is None:
            return
        end = offset + len(data)
        if self._directory is None:
            if self._tables * _ENTRY.size > MAX_DIRECTORY_BYTES:
                self._refuse("the vmdk's grain directory is larger than is judged")
                return
            start = self._directory_sector * SECTOR_BYTES
            self._directory = _Folding(start, self._tables * _ENTRY.size, table=-1)
        if self._directory.reach(offset, data):
            self._name_tables(self._directory.taken())
        pending = self._pending
        while (
            self._next_pending < len(pending)
            and (pending[self._next_pending] >> 32) * SECTOR_BYTES < end
        ):
            sector, table = pending[self._next_pending] >> 32, pending[self._next_pending] & _LOW
            self._next_pending += 1
            if sector * SECTOR_BYTES < offset:
                self._refuse(
                    f"the vmdk's grain table at sector {sector} comes before the grain "
                    "directory that names it"
                )
                return
            self._folding.append(
                _Folding(sector * SECTOR_BYTES, self._table_entries * _ENTRY.size, table)
            )
        for folding in self._folding:
            if folding.reach(offset, data):
                self._named += self._raised(folding.table, self._table_sum(folding.taken()))
        self._folding = [folding for folding in self._folding if not folding.done]

    def footer(self, directory_sector: int) -> None:
        """A footer placing the grain directory at `directory_sector`."""
        if self._directory_sector is not None or self.problem is not None:
            return
        if self._candidate is None or self._candidate[0] != directory_sector:
            self._refuse(
                f"the vmdk's footer places its grain directory at sector {directory_sector}, "
                "where no grain directory marker put one"
            )
            return
        self._named = self._candidate[1]

    def ended(self) -> str | None:
        """The stream ended: whether the tables and the markers place the same grains."""
        if self.problem is None and (self._next_pending < len(self._pending) or self._folding):
            self._refuse("the vmdk's grain directory names a grain table past its end")
        if self.problem is None and self._directory_sector is None and self._candidate is None:
            self._refuse("the vmdk has no grain directory")
        if self.problem is None and self._named % _PRIME != self._markers:
            self._refuse(
                "the vmdk's grain tables place its grains otherwise than its grain markers "
                "(qemu reads the tables, the export the markers)"
            )
        return self.problem

    def _name_tables(self, directory: bytes) -> None:
        named = [
            sector << 32 | table
            for table, (sector,) in enumerate(self._directory_entries(directory))
            if sector
        ]
        self._pending = array("Q", sorted(named))

    def _directory_entries(self, data: bytes) -> list[tuple[int]]:
        whole = data[: self._tables * _ENTRY.size].ljust(self._tables * _ENTRY.size, b"\0")
        return list(_ENTRY.iter_unpack(whole))

    def _table_sum(self, data: bytes) -> int:
        """A table's entries folded, entry i by r^i (an entry of 0 names no grain)."""
        whole = data.ljust(self._table_entries * _ENTRY.size, b"\0")
        total = 0
        for entry, (sector,) in enumerate(_ENTRY.iter_unpack(whole)):
            if sector:
                total += self._powers[entry] * self._value(sector)
        return total % _PRIME

    def _raised(self, table: int, table_sum: int) -> int:
        """A table's sum as the grains it maps: raised to its first grain."""
        return pow(self._r, table * self._table_entries, _PRIME) * table_sum % _PRIME

    def _value(self, sector: int) -> int:
        return (self._k1 * sector + self._k2) % _PRIME

    def _refuse(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem


class _Folding:
    """`length` bytes of the image from `start`, gathered as they pass (a table or the
    directory: at most MAX_DIRECTORY_BYTES)."""

    def __init__(self, start: int, length: int, table: int) -> None:
        self.start = start
        self._end = start + length
        self.table = table
        self._data = bytearray()
        self.done = False

    def reach(self, offset: int, data: bytes) -> bool:
        """Take what `data` (from `offset`) holds of the bytes; whether they are all here."""
        if self.done:
            return False
        need = self.start + len(self._data)
        if offset <= need < offset + len(data):
            self._data += data[need - offset : self._end - offset]
        self.done = self.start + len(self._data) >= self._end
        return self.done

    def taken(self) -> bytes:
        return bytes(self._data)
