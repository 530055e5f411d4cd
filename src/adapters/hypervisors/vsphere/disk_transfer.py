"""A vSphere VM's disk read at a point in time as a byte stream, and where a byte stream lands
as a disk: what ExportDisk and ImportDisk ask of vCenter (the transfer itself is theirs).

The bytes leave vCenter the way its own export tools take them, through an NFC export lease
(`nfc_export.py`: one streamOptimized vmdk per disk, whatever the datastore's layout), decoded
chunk by chunk in the pod for a raw or qcow2 export; a qcow2, whose tables precede its data, is
made whole in a file first: the staged object's own where the store keeps one (a PVC), else an
anonymous scratch file in PYRIGAUD_TRANSFER_SCRATCH_DIR (unlinked from the start: a killed
provider leaves nothing). They enter vCenter through an NFC import lease, at the
datastore site `disk_landing.py` holds.

Reading a running VM is refused unless it names a snapshot (the manager's sequence powers the
VM off and takes one); the state at a snapshot is read through the snapshot's own export lease.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.qcow2 import write_qcow2
from pyrigaud.adapters.disk_images.scratch import counted, given_or_scratch
from pyrigaud.adapters.disk_images.stream_optimized import (
    decode_stream_optimized,
    stream_optimized_capacity,
)
from pyrigaud.adapters.hypervisors.disk_streams import ChunkStream, Make, TransferStoppedError
from pyrigaud.adapters.hypervisors.vsphere.calls import attempt, run
from pyrigaud.adapters.hypervisors.vsphere.disk_landing import IMPORTING, DatastoreSite
from pyrigaud.adapters.hypervisors.vsphere.nfc_export import ExportedDisk, export_disk
from pyrigaud.adapters.hypervisors.vsphere.placement import Location, import_location
from pyrigaud.adapters.hypervisors.vsphere.snapshots import find_snapshot_tree
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import (
    ImportMarks,
    disk_index,
    power_state,
    virtual_disks,
)
from pyrigaud.application.ports.disk_transfer import DiskStream, LandingSite, TransferWatch
from pyrigaud.domain.disk_images import (
    HEADER_BYTES,
    LeftBehind,
    peek_header,
)
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskDetails, DiskQuery, DiskRead, Placement
from pyrigaud.domain.power import PowerState

# pyVmomi's stubs leave its data-object classes untyped: use them dynamically.
vim: Any = untyped_vim

EXPORT_FORMATS = ("vmdk", "qcow2", "raw")
IMPORT_FORMATS = ("vmdk", "qcow2", "raw")  # what the staged bytes may be, judged by their header
DISK_SUFFIX = ".vmdk"


class VSphereDiskTransfer:
    """DiskReading, DiskLanding and DiskFacts on vSphere."""

    def __init__(
        self,
        vcenter: VCenter,
        defaults: Placement,
        marks: ImportMarks,
        *,
        scratch_dir: str | None = None,
    ) -> None:
        self.vcenter = vcenter
        self.marks = marks
        self.scratch_dir = scratch_dir
        self._defaults = defaults

    @property
    def disk_suffix(self) -> str:
        return DISK_SUFFIX

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        """The disk asked for (the first when none is named); a linked clone's names the
        snapshot disk it grows from as its backing file."""

        def details(row: Mapping[str, Any]) -> Result[DiskDetails, ProviderError]:
            disks = virtual_disks(row)

            def detailed(index: int) -> DiskDetails:
                return _details(disks[index], is_bootable=index == 0)

            return disk_index(disks, query.disk_id, query.vm_id).map(detailed)

        def found(instance: Any) -> Result[DiskDetails, ProviderError]:
            return self.vcenter.found_row(instance, query.vm_id, ("config.hardware.device",)).bind(
                details
            )

        return run(self.vcenter.session, f"reading disks of VM {query.vm_id!r}", found)

    def read_disk(self, disk: DiskRead, watch: TransferWatch) -> Result[DiskStream, ProviderError]:
        doing = f"exporting a disk of VM {disk.vm_id!r}"
        properties = ("name", "runtime.powerState", "config.hardware.device", "config.firmware")

        def read(instance: Any) -> Result[DiskStream, ProviderError]:
            return self.vcenter.found_row(instance, disk.vm_id, properties).bind(
                partial(self._read_from, instance, _Asked(disk, watch), doing)
            )

        return run(self.vcenter.session, doing, read)

    def landing_site(self, stem: str, storage_hint: str) -> Result[LandingSite, ProviderError]:
        def site(instance: Any) -> Result[LandingSite, ProviderError]:
            def unclaimed(location: Location) -> Result[LandingSite, ProviderError]:
                transient = self.vcenter.record(instance, stem)
                refused = (
                    Success(None)
                    if transient is None
                    else self.marks.refuse_unfinished(transient, "an import of the disk")
                )

                def landing(_unclaimed: None) -> LandingSite:
                    return DatastoreSite(
                        self.vcenter,
                        self.marks,
                        self.scratch_dir,
                        location,
                        datastore=str(location.datastore.name),
                        name=stem,
                    )

                return refused.map(landing)

            return import_location(instance, self._defaults, storage_hint).bind(unclaimed)

        return run(self.vcenter.session, IMPORTING, site)

    def _read_from(
        self, instance: Any, asked: _Asked, doing: str, row: Mapping[str, Any]
    ) -> Result[DiskStream, ProviderError]:
        name = str(row.get("name") or asked.disk.vm_id)
        disks = virtual_disks(row)
        chosen = Result.do(
            (index, left_behind + source[1], source[0])
            for index in disk_index(disks, asked.disk.disk_id, name)
            for left_behind in preflight(name, disks[index], row)
            for source in self._source(instance, asked.disk, row, name)
        )

        def streamed(
            found: tuple[int, tuple[LeftBehind, ...], Any],
        ) -> Result[DiskStream, ProviderError]:
            return self._stream(instance, asked, doing, name, *found)

        return chosen.bind(streamed)

    def _source(
        self, instance: Any, disk: DiskRead, row: Mapping[str, Any], name: str
    ) -> Result[tuple[Any, tuple[LeftBehind, ...]], ProviderError]:
        """What the disk is read from (the VM, or the snapshot asked for) and what later
        snapshots stay behind; a running VM is refused unless a snapshot is named."""
        if disk.snapshot_id is not None:
            return find_snapshot_tree(self.vcenter, instance, disk.vm_id, disk.snapshot_id).map(
                _snapshot_source
            )
        if power_state(row) != PowerState.OFF:
            return Failure(
                ProviderError.failed_precondition(
                    f"VM {name!r} is running (its disk is changing): power it off, or export "
                    "from a snapshot (snapshot_id)"
                )
            )
        return Success((row["_ref"], ()))

    def _stream(  # noqa: PLR0917 (what _read_from chose, in order)
        self,
        instance: Any,
        asked: _Asked,
        doing: str,
        name: str,
        index: int,
        left_behind: tuple[LeftBehind, ...],
        source: Any,
    ) -> Result[DiskStream, ProviderError]:
        """The disk's bytes in the format asked for, the export lease held until the stream
        closes; a Failure on the way aborts the lease, as an exception does."""
        holds = contextlib.ExitStack()
        try:
            opened = export_disk(instance, source, index, holds).bind(
                partial(self._converted, holds, asked=asked, name=name, doing=doing)
            )
        except BaseException:
            holds.__exit__(*sys.exc_info())  # the lease is aborted, not completed
            raise
        match opened:
            case Failure():
                stopped = TransferStoppedError("the export failed before its first chunk")
                holds.__exit__(TransferStoppedError, stopped, None)

        def read_at_the_edge(
            read: Callable[[], Result[bytes, ProviderError]],
        ) -> Result[bytes, ProviderError]:
            return attempt(doing, read)

        def chunk_stream(found: tuple[Iterator[bytes] | Make, int | None]) -> DiskStream:
            return ChunkStream(*found, holds, read_at_the_edge, left_behind)

        return opened.map(chunk_stream)

    def _converted(
        self,
        holds: contextlib.ExitStack,
        disk: ExportedDisk,
        asked: _Asked,
        name: str,
        doing: str,
    ) -> Result[tuple[Iterator[bytes] | Make, int | None], ProviderError]:
        """The disk's chunks in the format asked for (or how its image is made), and their
        size when known."""
        vmdk = disk.chunks()
        if asked.disk.format == "vmdk":
            return Success((vmdk, disk.size_bytes))
        if asked.disk.format == "raw":
            header, rest = peek_header(vmdk, HEADER_BYTES)

            def decoded(capacity: int) -> tuple[Iterator[bytes], int]:
                return (decode_stream_optimized(rest), capacity)

            return stream_optimized_capacity(header).map(decoded)
        return Success((self._as_qcow2(holds, vmdk, asked.watch, doing), None))

    def _as_qcow2(
        self, holds: contextlib.ExitStack, vmdk: Iterator[bytes], watch: TransferWatch, doing: str
    ) -> Make:
        """qcow2's tables come before its data: the image is made whole in a file first, the
        whole disk read off the lease meanwhile (counted, and stopped, through `watch`)."""

        def made(given: BinaryIO | None) -> Result[BinaryIO, ProviderError]:
            peeked = counted(vmdk, watch).consumed_by(partial(peek_header, count=HEADER_BYTES))
            file = given_or_scratch(given, self.scratch_dir, holds)
            return Result.do(
                file
                for header, rest in peeked
                for capacity_bytes in stream_optimized_capacity(header)
                for _ in write_qcow2(decode_stream_optimized(rest), capacity_bytes, file)
            )

        def make(given: BinaryIO | None) -> Result[BinaryIO, ProviderError]:
            return attempt(doing, partial(made, given))

        return make


@dataclass(frozen=True)
class _Asked:
    """The disk asked for, and the watch of the export that asked."""

    disk: DiskRead
    watch: TransferWatch


def preflight(
    vm: str, disk: Any, row: Mapping[str, Any]
) -> Result[tuple[LeftBehind, ...], ProviderError]:
    """What the moved disk will not carry. Refused before a byte moves: a disk whose content
    no export lease can give at one point in time (independent of snapshots, a raw device
    mapping: the LUN's data is no vmdk's, shared with other VMs: multi-writer), and a VM with
    PCI passthrough devices (a moved disk cannot take them along)."""
    devices = row.get("config.hardware.device") or ()
    if any(isinstance(device, vim.vm.device.VirtualPCIPassthrough) for device in devices):
        return Failure(
            ProviderError.failed_precondition(
                f"VM {vm!r} has PCI passthrough devices: a moved disk cannot take them "
                "along; remove them, then export"
            )
        )
    backing = disk.backing
    mode = str(getattr(backing, "diskMode", "") or "")
    problem = ""
    if mode.startswith("independent"):
        problem = f"is independent ({mode}): snapshots do not cover it"
    elif isinstance(backing, vim.vm.device.VirtualDisk.RawDiskMappingVer1BackingInfo):
        problem = "is a raw device mapping: its data lives on the LUN, not in a vmdk"
    elif str(getattr(backing, "sharing", "") or "sharingNone") != "sharingNone":
        problem = "is shared with other VMs (multi-writer): no point in time holds for it"
    if problem:
        return Failure(
            ProviderError.failed_precondition(
                f"VM {vm!r}: disk {disk.key} {problem}; it cannot move faithfully"
            )
        )
    left: list[LeftBehind] = []
    if len(virtual_disks(row)) > 1:
        left.append(LeftBehind.OTHER_DISKS)
    if any(isinstance(device, vim.vm.device.VirtualTPM) for device in devices):
        left.append(LeftBehind.TPM)
    if row.get("config.firmware") == "efi":
        left.append(LeftBehind.NVRAM)
    return Success(tuple(left))


def _snapshot_source(node: Any) -> tuple[Any, tuple[LeftBehind, ...]]:
    """A snapshot read, and whether later snapshots stay behind."""
    return (node.snapshot, (LeftBehind.LATER_SNAPSHOTS,) if node.childSnapshotList else ())


def _details(disk: Any, *, is_bootable: bool) -> DiskDetails:
    parent = getattr(disk.backing, "parent", None)
    return DiskDetails(
        disk_id=str(disk.key),
        format="vmdk",
        path=str(disk.backing.fileName),
        virtual_size_bytes=int(disk.capacityInKB) * 1024,
        is_bootable=is_bootable,
        backing_file=str(parent.fileName) if parent is not None else "",
    )
