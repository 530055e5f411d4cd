"""A staged image's disk read through qemu's own map of it, instead of through a raw copy.

`qemu-img map` names every extent of the disk that holds data and where its bytes lie in the
image file; between those extents the disk reads as zeros. qemu itself refuses to map data it
cannot point at (compressed or encrypted clusters, data in another file), and such an image is
then converted whole, as before. So the disk of a qcow2 or sparse vmdk whose data is stored
plain (what qemu-img, libvirt and the clouds write) is read straight from the staged file:
no raw copy of the whole disk is written to scratch and read back, and qemu-img reads only the
image's tables.

The map is written to a scratch file, never held: a hostile image may have millions of
extents. Each extent is checked against the disk's size and the extents' order before a byte
of it is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.blocks import (
    MAX_CHUNK_BYTES,
    SECTOR_BYTES,
    round_up,
    zero_chunks,
)
from pyrigaud.adapters.disk_images.qemu_img import (
    CONVERSION_ADDRESS_SPACE_BYTES,
    QemuImgLimits,
    run_qemu_img,
)
from pyrigaud.adapters.disk_images.scratch import open_scratch
from pyrigaud.application.ports.disk_transfer import TransferWatch
from pyrigaud.domain import fields
from pyrigaud.domain.chunks import Chunks, successes
from pyrigaud.domain.disk_images import JudgedImage
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.leftovers import TRANSFER_DEADLINE_SECONDS

_MAP_HEADER = "Offset"  # the first line of qemu-img's human map names its columns


@dataclass(frozen=True)
class MappedDisk:
    """The disk of a staged image: `chunks` reads it whole (`capacity_bytes`), in order."""

    chunks: Chunks[bytes]
    capacity_bytes: int


def mapped_disk(
    image_file: IO[bytes], image: JudgedImage, scratch_dir: str | None, watch: TransferWatch
) -> Result[MappedDisk | None, ProviderError]:
    """The disk of `image`, staged in the seekable `image_file`, read through qemu's map of it;
    None when qemu cannot point at its data (it is to be converted instead). The chunks read
    `image_file` as they go: it stays open until they are read. qemu-img is stopped through
    `watch`."""
    image_file.flush()
    descriptor = image_file.fileno()
    path = f"/dev/fd/{descriptor}"
    image_bytes = os.fstat(descriptor).st_size
    extents = open_scratch(scratch_dir)
    # A line of the map names at least one sector of data in the image file, in fewer
    # characters: a map longer than the image file is no map of it.
    mapped = run_qemu_img(
        ["map", "--output=human", "-f", image.format, path],
        doing=f"mapping the staged {image.format} image",
        watch=watch,
        limits=QemuImgLimits(
            address_space_bytes=CONVERSION_ADDRESS_SPACE_BYTES,
            cpu_seconds=int(TRANSFER_DEADLINE_SECONDS),
            wall_seconds=TRANSFER_DEADLINE_SECONDS,
            file_size_bytes=image_bytes + MAX_CHUNK_BYTES,
        ),
        pass_fds=(descriptor,),
        refused=ProviderError.failed_precondition,
        output=extents,
    )
    match mapped:
        case Failure(ProviderError(kind=ErrorKind.FAILED_PRECONDITION)):
            extents.close()
            return Success(None)
        case Failure() as failed:
            extents.close()
            return failed
    extents.seek(0)
    capacity = round_up(image.virtual_size_bytes, SECTOR_BYTES)
    read = _Reading(descriptor, path, image_bytes, capacity)
    return Success(MappedDisk(Chunks(read.disk(extents)), capacity))


@dataclass(frozen=True)
class _Reading:
    """What the extents of one map must agree with."""

    descriptor: int
    path: str
    image_bytes: int
    capacity_bytes: int

    def disk(self, extents: IO[bytes]) -> Iterator[Result[bytes, ProviderError]]:
        """The disk in order: zeros between the mapped extents, each extent's bytes read from
        the image file where qemu says they are."""
        with extents:
            position = 0
            for number, line in enumerate(extents):
                if number == 0 and line.decode(errors="replace").startswith(_MAP_HEADER):
                    continue
                match self._extent(line, position):
                    case Failure() as refused:
                        yield refused
                        return
                    case Success((start, length, offset)):
                        yield from successes(zero_chunks(start - position))
                        yield from self._data(offset, length)
                        position = start + length
            yield from successes(zero_chunks(self.capacity_bytes - position))

    def _extent(self, line: bytes, position: int) -> Result[tuple[int, int, int], ProviderError]:
        """(start in the disk, length, offset in the image file) of one line of the map."""
        fields = line.decode(errors="replace").split()
        try:
            start, length, offset = (int(field, 16) for field in fields[:3])
        except ValueError:
            return self._refused(f"a line qemu-img's map should not have: {line[:100]!r}")
        if fields[3:] != [self.path]:
            return self._refused(f"data in another file than the image: {' '.join(fields[3:])}")
        if start < position or length <= 0 or start + length > self.capacity_bytes:
            return self._refused(f"an extent out of order or past the disk's end: {start}+{length}")
        if offset + length > self.image_bytes:
            return self._refused(f"an extent past the image file's end: {offset}+{length}")
        return Success((start, length, offset))

    def _data(self, offset: int, length: int) -> Iterator[Result[bytes, ProviderError]]:
        end = offset + length
        while offset < end:
            chunk = os.pread(self.descriptor, min(MAX_CHUNK_BYTES, end - offset), offset)
            if not chunk:
                yield self._refused(f"the image file ends at {offset}, inside an extent")
                return
            yield Success(chunk)
            offset += len(chunk)

    @staticmethod
    def _refused(reason: str) -> Failure[ProviderError]:
        return Failure(
            ProviderError.invalid_spec(fields.SOURCE_URL, f"qemu-img's map of the image: {reason}")
        )
