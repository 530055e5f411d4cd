"""DiskReading, DiskLanding and DiskFacts on the fake hypervisor: a disk reads as a few bytes
that stand for it (its id, size, snapshot and the format asked for), and landed bytes become a
base image a Create can name. The transfer around them is the real one (the use cases, the
staging storage), so checksums, their verification, retries and name clashes are exercised on
the fake exactly as on a real backend."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import BinaryIO

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.fake.hypervisor import (
    DISK_DIR,
    FakeDisk,
    FakeHypervisor,
    FakeImage,
    FakeVM,
)
from pyrigaud.application.ports.disk_transfer import TransferWatch
from pyrigaud.domain.disk_images import JudgedImage, LandedDisk, LeftBehind
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskDetails, DiskQuery, DiskRead

GIB = 1024**3
IMPORTED_DISK_GIB = 1
DISK_SUFFIX = ".qcow2"


@dataclass(frozen=True)
class FakeDiskTransfer:
    hypervisor: FakeHypervisor

    @property
    def disk_suffix(self) -> str:
        return DISK_SUFFIX

    def read_disk(
        self, disk: DiskRead, watch: TransferWatch
    ) -> Result[_FakeDiskStream, ProviderError]:
        del watch  # nothing is read into the pod first: the use case counts every byte

        def read(found: FakeDisk) -> _FakeDiskStream:
            at = disk.snapshot_id or "now"
            content = f"fake disk {found.id} of {found.size_gib} GiB at {at} as {disk.format}\n"
            others = len(self.hypervisor.vms[disk.vm_id].disks) > 1
            return _FakeDiskStream(
                [content.encode()],
                (LeftBehind.OTHER_DISKS,) if others else (),
                made_whole_first=disk.format == "qcow2",
            )

        def stream() -> Result[_FakeDiskStream, ProviderError]:
            return self._disk(disk.vm_id, disk.disk_id, disk.snapshot_id or "").map(read)

        return self.hypervisor.serve("read_disk", stream)

    def landing_site(self, stem: str, storage_hint: str) -> Result[_FakeSite, ProviderError]:
        del storage_hint  # the fake has one place for disks

        def site() -> Result[_FakeSite, ProviderError]:
            return Success(_FakeSite(self.hypervisor, stem))

        return self.hypervisor.serve("landing_site", site)

    def sweep_transfer_leftovers(
        self, older_than_seconds: float
    ) -> Result[tuple[str, ...], ProviderError]:
        """Landings are in memory: a dead transfer leaves nothing in the hypervisor."""
        del older_than_seconds
        return self.hypervisor.serve("sweep_transfer_leftovers", partial(Success, ()))

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        def details(disk: FakeDisk) -> DiskDetails:
            vm = self.hypervisor.vms[query.vm_id]
            return DiskDetails(
                disk_id=disk.id,
                format=disk.format,
                virtual_size_bytes=disk.size_gib * GIB,
                actual_size_bytes=disk.size_gib * GIB // 10,
                path=disk.path,
                is_bootable=disk.id == vm.disks[0].id,
                snapshots=tuple(vm.snapshots),
                backing_file=disk.backing_file,
                metadata={"vm": vm.name},
            )

        def detailed() -> Result[DiskDetails, ProviderError]:
            return self._disk(query.vm_id, query.disk_id, query.snapshot_id).map(details)

        return self.hypervisor.serve("disk_details", detailed)

    def _disk(self, vm_id: str, disk_id: str, snapshot_id: str) -> Result[FakeDisk, ProviderError]:
        """A copy of the VM's disk by id or path (the root disk when none is named)."""
        return self.hypervisor.vm(vm_id).bind(
            partial(disk_of, disk_id=disk_id, snapshot_id=snapshot_id)
        )


def disk_of(vm: FakeVM, disk_id: str, snapshot_id: str) -> Result[FakeDisk, ProviderError]:
    if snapshot_id and snapshot_id not in vm.snapshots:
        return _not_found(f"VM {vm.name!r} has no snapshot {snapshot_id!r}")
    if not disk_id:
        if not vm.disks:
            return _not_found(f"VM {vm.name!r} has no disks")
        return Success(copy.copy(vm.disks[0]))
    for disk in vm.disks:
        if disk_id in (disk.id, disk.path):
            return Success(copy.copy(disk))
    return _not_found(f"VM {vm.name!r} has no disk {disk_id!r}")


@dataclass
class _FakeDiskStream:
    chunks: list[bytes]
    left_behind: tuple[LeftBehind, ...] = ()
    # A qcow2 is made whole first, as on the real backends: the same path through the store.
    made_whole_first: bool = False

    @property
    def size_bytes(self) -> int | None:
        return sum(len(chunk) for chunk in self.chunks)

    def make(self, into: BinaryIO | None) -> Result[None, ProviderError]:
        if into is not None:
            into.write(b"".join(self.chunks))
            self.chunks.clear()
        return Success(None)

    def read_chunk(self) -> Result[bytes, ProviderError]:
        return Success(self.chunks.pop(0) if self.chunks else b"")

    def close(self) -> None:
        self.chunks.clear()


@dataclass(frozen=True)
class _FakeSite:
    hypervisor: FakeHypervisor
    disk_name: str
    place: str = "the fake hypervisor"

    @property
    def path(self) -> str:
        return f"{DISK_DIR}/{self.disk_name}{DISK_SUFFIX}"

    def earlier_record(self) -> Result[bytes | None, ProviderError]:
        def earlier() -> Result[bytes | None, ProviderError]:
            if self.path not in self.hypervisor.images:
                self.hypervisor.import_records.pop(self.disk_name, None)
            return Success(self.hypervisor.import_records.get(self.disk_name))

        return self.hypervisor.serve("earlier_record", earlier)

    def receive(
        self,
        chunks: Iterable[bytes],
        size_bytes: int | None,
        image: JudgedImage,
        watch: TransferWatch,
    ) -> Result[_FakeReceived, ProviderError]:
        del size_bytes, image, watch  # any image stands for a disk here, held at once
        return Success(_FakeReceived(self, b"".join(chunks)))

    def keep_record(self, record: bytes, landed: LandedDisk) -> Result[None, ProviderError]:
        def keep() -> Result[None, ProviderError]:
            self.hypervisor.import_records[self.disk_name] = record
            return Success(None)

        del landed
        return self.hypervisor.serve("keep_record", keep)


@dataclass
class _FakeReceived:
    site: _FakeSite
    content: bytes

    def land(self) -> Result[LandedDisk, ProviderError]:
        """The image a Create can name; one of that name holding other bytes is a clash."""
        hypervisor, site = self.site.hypervisor, self.site

        def land() -> Result[LandedDisk, ProviderError]:
            earlier = hypervisor.imported.setdefault(site.disk_name, self.content)
            if earlier != self.content:
                return Failure(
                    ProviderError.already_exists(
                        f"target_name: {site.place} already has a disk {site.disk_name!r} "
                        "with other content; delete it or pick another target_name"
                    )
                )
            made_now = site.path not in hypervisor.images
            hypervisor.images.setdefault(
                site.path, FakeImage(id=site.disk_name, path=site.path, size_gib=IMPORTED_DISK_GIB)
            )
            return Success(LandedDisk(path=site.path, made_now=made_now))

        return hypervisor.serve("land", land)

    def discard(self) -> None:
        self.content = b""


def _not_found(message: str) -> Failure[ProviderError]:
    return Failure(ProviderError.not_found(message))
