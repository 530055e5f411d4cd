"""A staged disk landed on a datastore as a plain disk file, through an NFC import lease
(`disk_import.py`: a transient one-disk VM, unregistered once the disk landed).

vCenter takes only a streamOptimized vmdk, and nothing reaches it before the checksum of the
staged bytes is known: the staged disk is held as a streamOptimized vmdk in an anonymous
scratch file (PYRIGAUD_TRANSFER_SCRATCH_DIR, unlinked from the start: a killed provider leaves
nothing) until then. A staged streamOptimized vmdk is kept as it is, once qemu has read it
whole; a raw disk is encoded by pyrigaud's streamOptimized encoder (faster than qemu-img's own
on incompressible disks); a qcow2 or monolithicSparse vmdk is read as qemu reads it, through
qemu-img's map of it (`disk_images/qemu_map.py`) or, for data qemu cannot point at,
qemu-img's conversion into a raw disk, then encoded. The import's record is a small file
beside the disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import partial
from typing import IO, Any, BinaryIO

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.qemu_img import (
    CONVERSION_ADDRESS_SPACE_BYTES,
    QemuImgLimits,
    checked_vmdk,
    run_qemu_img,
)
from pyrigaud.adapters.disk_images.qemu_map import MappedDisk, mapped_disk
from pyrigaud.adapters.disk_images.scratch import file_chunks, open_scratch, scratch_file, spool
from pyrigaud.adapters.disk_images.stream_optimized import (
    encode_stream_optimized,
)
from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.vsphere import datastore_files
from pyrigaud.adapters.hypervisors.vsphere.calls import Edge, run
from pyrigaud.adapters.hypervisors.vsphere.disk_import import import_stream_optimized
from pyrigaud.adapters.hypervisors.vsphere.placement import Location
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import ImportMarks
from pyrigaud.application.import_record import parse_record
from pyrigaud.application.ports.disk_transfer import ReceivedDisk, TransferWatch
from pyrigaud.domain import fields
from pyrigaud.domain.disk_images import IMPORT_RECORD_SUFFIX, JudgedImage, LandedDisk
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import TRANSFER_DEADLINE_SECONDS

SECTOR_ALLOWANCE_BYTES = 512  # qemu rounds a disk up to whole sectors
IMPORTING = "importing a disk"  # the URL is not echoed before it is checked


def record_path(folder: str) -> str:
    """Where an import into `folder` ("[ds] name", the disk inside it) keeps its record:
    `[ds] name/name.pyrigaud-import.json`."""
    name = folder.rpartition("] ")[2].rpartition("/")[2]
    return f"{folder}/{name}{IMPORT_RECORD_SUFFIX}"


class DatastoreSite:
    """An import into `[<datastore>] <name>/`, its record beside the disk, through `vcenter`;
    the transient VM it lands through carries `marks`, its scratch files are in `scratch_dir`."""

    def __init__(
        self,
        vcenter: VCenter,
        marks: ImportMarks,
        scratch_dir: str | None,
        location: Location,
        *,
        datastore: str,
        name: str,
    ) -> None:
        self.vcenter = vcenter
        self.marks = marks
        self.scratch_dir = scratch_dir
        self.location = location
        self.disk_name = name
        self.folder = f"[{datastore}] {name}"
        self.place = f"datastore {datastore!r}"
        self._record_path = record_path(self.folder)

    def earlier_record(self) -> Result[bytes | None, ProviderError]:
        """The record of an earlier import under this name whose disk is still there; the
        record of a disk deleted since (with the VM made around it) goes with its folder."""

        def judged(instance: Any, record: bytes | None) -> Result[bytes | None, ProviderError]:
            if record is None:
                return Success(None)
            earlier = parse_record(record)
            if earlier is None or not earlier.result.path:
                return Success(record)  # not ours to judge: a clash

            def kept_if_there(there: bool) -> Result[bytes | None, ProviderError]:
                if there:
                    return Success(record)
                return datastore_files.delete(instance, self.folder)

            return datastore_files.exists(instance, earlier.result.path).bind(kept_if_there)

        def read(instance: Any) -> Result[bytes | None, ProviderError]:
            return datastore_files.read_small(instance, self._record_path).bind(
                partial(judged, instance)
            )

        return run(self.vcenter.session, IMPORTING, read)

    def receive(
        self,
        chunks: Iterable[bytes],
        size_bytes: int | None,
        image: JudgedImage,
        watch: TransferWatch,
    ) -> Result[ReceivedDisk, ProviderError]:
        """The staged disk as a streamOptimized vmdk in a scratch file, qemu-img's runs on the
        way stopped through `watch`."""

        with Edge(IMPORTING) as edge:
            vmdk = open_scratch(self.scratch_dir)
            written = undone_on_failure(
                partial(self._stream_optimized, chunks, size_bytes, image, vmdk, watch), vmdk.close
            )

            def to_upload(capacity: int) -> ReceivedDisk:
                return _ReceivedVmdk(self, vmdk, vmdk.tell(), capacity)

            return written.map(to_upload)
        return edge.failure

    def keep_record(self, record: bytes, landed: LandedDisk) -> Result[None, ProviderError]:
        def forget(instance: Any) -> None:
            """The disk this import made goes with a record that could not be kept (the
            record's failure is the one told)."""
            if landed.made_now:
                datastore_files.delete(instance, self.folder)

        def keep(instance: Any) -> Result[None, ProviderError]:
            return undone_on_failure(
                partial(datastore_files.write_small, instance, self._record_path, record),
                partial(forget, instance),
            )

        return run(self.vcenter.session, IMPORTING, keep)

    def _stream_optimized(
        self,
        chunks: Iterable[bytes],
        size_bytes: int | None,
        image: JudgedImage,
        vmdk: IO[bytes],
        watch: TransferWatch,
    ) -> Result[int, ProviderError]:
        """The staged disk written to `vmdk` as a streamOptimized vmdk; its capacity."""
        if image.stream_optimized_vmdk:
            spool(chunks, vmdk)

            def capacity(_checked: None) -> int:
                return image.virtual_size_bytes

            return checked_vmdk(vmdk, image.virtual_size_bytes, fields.SOURCE_URL, watch=watch).map(
                capacity
            )
        if image.format == "raw":
            if size_bytes is None:
                return Failure(
                    ProviderError.invalid_spec(
                        fields.SOURCE_URL, "the staging storage does not tell the raw image's size"
                    )
                )
            return _encoded(chunks, size_bytes, vmdk)
        # A qcow2, a monolithicSparse vmdk: their disk as qemu reads it, through its map of
        # the staged file, else converted by qemu into a raw disk first.
        with scratch_file(self.scratch_dir) as staged:
            spool(chunks, staged)
            mapped = mapped_disk(staged, image, self.scratch_dir, watch)
            match mapped:
                case Success(MappedDisk() as disk):
                    return _encoded(disk.chunks, disk.capacity_bytes, vmdk)
            with scratch_file(self.scratch_dir) as raw:

                def converted(_unmapped: object) -> Result[int, ProviderError]:
                    return _read_by_qemu(staged, image, raw, watch)

                def encoded(capacity: int) -> Result[int, ProviderError]:
                    return _encoded(file_chunks(raw), capacity, vmdk)

                return mapped.bind(converted).bind(encoded)


def _encoded(disk: Iterable[bytes], capacity: int, vmdk: IO[bytes]) -> Result[int, ProviderError]:
    """The raw `disk` of `capacity` bytes written to `vmdk` as a streamOptimized vmdk; its
    capacity, or why the encoding stopped (a disk of another size than said)."""

    def whole(_ended: None) -> int:
        return capacity

    # Written by the file's own writelines: no frame of ours between the file and the encoder.
    return encode_stream_optimized(disk, capacity).consumed_by(vmdk.writelines).map(whole)


def _read_by_qemu(
    staged: IO[bytes], image: JudgedImage, raw: IO[bytes], watch: TransferWatch
) -> Result[int, ProviderError]:
    """The staged image's disk written to `raw` by qemu-img (bounded, and refusing what qemu
    finds corrupt); its size, `raw` read from its start."""
    staged.flush()
    converted = run_qemu_img(
        [
            *("convert", "-f", image.format, "-O", "raw"),
            *(f"/dev/fd/{staged.fileno()}", f"/dev/fd/{raw.fileno()}"),
        ],
        doing=f"reading the staged {image.format} image",
        watch=watch,
        limits=QemuImgLimits(
            address_space_bytes=CONVERSION_ADDRESS_SPACE_BYTES,
            cpu_seconds=int(TRANSFER_DEADLINE_SECONDS),
            wall_seconds=TRANSFER_DEADLINE_SECONDS,
            file_size_bytes=image.virtual_size_bytes + SECTOR_ALLOWANCE_BYTES,
        ),
        pass_fds=(staged.fileno(), raw.fileno()),
    )

    def size(_: object) -> int:
        raw.seek(0)
        return os.fstat(raw.fileno()).st_size

    return converted.map(size)


def _landed(path: str) -> LandedDisk:
    return LandedDisk(path=path)


class _ReceivedVmdk:
    """The staged disk as a streamOptimized vmdk of `size_bytes` in `vmdk`, to upload."""

    def __init__(
        self, site: DatastoreSite, vmdk: BinaryIO, size_bytes: int, capacity_bytes: int
    ) -> None:
        self._site = site
        self._vmdk = vmdk
        self._size_bytes = size_bytes
        self._capacity_bytes = capacity_bytes

    def land(self) -> Result[LandedDisk, ProviderError]:
        site = self._site
        imported = partial(
            import_stream_optimized,
            vmdk=self._vmdk,
            size_bytes=self._size_bytes,
            name=site.disk_name,
            location=site.location,
            capacity_bytes=self._capacity_bytes,
            marks=site.marks.building(),
        )
        doing = f"importing disk {site.disk_name!r}"
        return run(site.vcenter.session, doing, imported).map(_landed)

    def discard(self) -> None:
        self._vmdk.close()
