"""A store that stops answering mid-transfer (docs/staging-resilience.md): ExportDisk and
ImportDisk, through the real S3 and NFS adapters on the fake hypervisor, wait out a cut
connection or a short outage and move every byte once; past the retry budget they answer
UNAVAILABLE in a bounded time, leave nothing under the staged name, and the failed upload is
aborted as soon as the store is back, not by the hourly sweep.

S3 is moto behind a TCP fault proxy (tests/support/fault_proxy.py) that cuts connections or refuses
them for a while once some bytes have passed; NFS is nfs-ganesha, stopped and started again
mid-transfer. The long outage runs with a 5 s budget and a 12 s outage instead of 30 s and
longer, to keep the suite quick; the bound checked is the same rule (budget + one request +
one pause)."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.fake.backend import fake_backend
from pyrigaud.adapters.hypervisors.fake.disk_transfer import FakeDiskTransfer
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.adapters.staging.nfs import NfsStaging
from pyrigaud.adapters.staging.s3 import S3Staging
from pyrigaud.application.ports.disk_transfer import TransferWatch
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import (
    CreateRequest,
    DiskRead,
    OwnerMark,
    VMClass,
    VMImage,
)

from support import ManualClock, error_of, ok, wait_until
from support.fault_proxy import FaultProxy, fault_proxy
from support.staging import (
    S3_PART_BYTES,
    MiB,
    NfsServer,
    S3Server,
    migration_name,
    nfs_options,
    s3_credentials,
    s3_options,
    system_time,
)
from support.transfer import DiskMoves, disk_moves, export_disk, import_disk

pytestmark = pytest.mark.slow

DISK = random.Random(26).randbytes(16 * MiB)  # four 5 MiB parts on S3
DISK_SHA256 = hashlib.sha256(DISK).hexdigest()
HALF_WAY = len(DISK) // 2
PIECE_BYTES = MiB  # what the fake disk reads at a time
SHORT_BUDGET_SECONDS = 5.0
OUTAGE_UNTIL_ENDED_SECONDS = 3600.0  # the test ends it
ABORT_PATIENCE_SECONDS = 60.0  # a liveness bound


@dataclass
class _Disk:
    """The disk as the hypervisor streams it, telling `passed` of the bytes read so far."""

    passed: Callable[[int], None]
    offset: int = 0
    left_behind: tuple[Any, ...] = ()
    made_whole_first: bool = False  # its bytes come in order

    @property
    def size_bytes(self) -> int:
        return len(DISK)

    def make(self, into: Any) -> Result[None, ProviderError]:
        del into
        return Success(None)

    def read_chunk(self) -> Result[bytes, ProviderError]:
        piece = DISK[self.offset : self.offset + PIECE_BYTES]
        self.offset += len(piece)
        self.passed(self.offset)
        return Success(piece)

    def close(self) -> None:
        return


@dataclass
class _CountedSite:
    """The fake's landing site, telling `passed` of the bytes it has received so far."""

    site: Any
    passed: Callable[[int], None]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.site, name)

    def receive(
        self, chunks: Iterable[bytes], size_bytes: int | None, image: Any, watch: Any
    ) -> Any:
        def counted() -> Iterator[bytes]:
            received = 0
            for chunk in chunks:
                received += len(chunk)
                self.passed(received)
                yield chunk

        return self.site.receive(counted(), size_bytes, image, watch)


@dataclass
class DiskOfSize:
    """The fake hypervisor's disk transfer with every disk reading as DISK; `passed` hears of
    each transfer's progress (bytes read at an export, received at an import)."""

    fake: FakeDiskTransfer
    passed: Callable[[int], None] = lambda _: None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    def read_disk(self, disk: DiskRead, watch: TransferWatch) -> Result[_Disk, ProviderError]:
        return self.fake.read_disk(disk, watch).map(lambda _: _Disk(self.passed))

    def landing_site(self, stem: str, storage_hint: str) -> Result[_CountedSite, ProviderError]:
        found = self.fake.landing_site(stem, storage_hint)
        return found.map(lambda site: _CountedSite(site, self.passed))


@dataclass
class Hypervisor:
    fake: FakeHypervisor
    disks: DiskOfSize
    vm_id: str
    moves: DiskMoves = field(init=False)


def hypervisor_over(staging: Any) -> Hypervisor:
    fake = FakeHypervisor(ManualClock())
    fake.add_image("/images/base.qcow2")
    backend = fake_backend(fake)
    assert isinstance(backend.disk_transfer, FakeDiskTransfer)
    disks = DiskOfSize(backend.disk_transfer)
    backend = dataclasses.replace(backend, disk_transfer=disks)
    request = CreateRequest(
        name="outage",
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=VMImage(path="/images/base.qcow2"),
    )
    vm_id = ok(backend.lifecycle.start_create(request, OwnerMark(provider="tests/outages"))).id
    made = Hypervisor(fake, disks, vm_id)
    made.moves = disk_moves(backend, staging)
    return made


def once_past(offset: int, fault: Callable[[], object]) -> Callable[[int], None]:
    """A progress hook that runs `fault` once the transfer is past `offset`."""
    fired = threading.Event()

    def passed(moved: int) -> None:
        if moved >= offset and not fired.is_set():
            fired.set()
            fault()

    return passed


# --- S3 --------------------------------------------------------------------------------------


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with fault_proxy(s3_server.endpoint) as proxy:
        yield proxy


def s3_staging(retry_seconds: float = 30.0) -> S3Staging:
    return S3Staging(
        owner="tests/outages",
        part_bytes=S3_PART_BYTES,
        retry_seconds=retry_seconds,
        **system_time(),
    )


@dataclass
class S3Place:
    server: S3Server
    proxy: FaultProxy
    folder: str

    def url(self, name: str) -> str:
        return f"s3://{self.server.bucket}/{self.folder}/{name}"

    def export(self, hypervisor: Hypervisor, name: str) -> Result[Any, ProviderError]:
        return export_disk(
            hypervisor.moves,
            hypervisor.vm_id,
            self.url(name),
            backend="s3",
            disk_format="raw",
            options=s3_options(self.server, self.proxy.endpoint),
            credentials=s3_credentials(self.server),
        )

    def import_(self, hypervisor: Hypervisor, name: str, target: str) -> Result[Any, ProviderError]:
        return import_disk(
            hypervisor.moves,
            self.url(name),
            target_name=target,
            backend="s3",
            disk_format="raw",
            expected_checksum=DISK_SHA256,
            options=s3_options(self.server, self.proxy.endpoint),
            credentials=s3_credentials(self.server),
        )

    def stored(self, name: str) -> bytes | None:
        client = self.server.client()
        try:
            answer = client.get_object(Bucket=self.server.bucket, Key=f"{self.folder}/{name}")
        except client.exceptions.NoSuchKey:
            return None
        return bytes(answer["Body"].read())

    def leftovers(self) -> list[str]:
        """Uploads in progress in the folder, and the markers beside them."""
        client = self.server.client()
        uploads = client.list_multipart_uploads(Bucket=self.server.bucket, Prefix=self.folder)
        markers = client.list_objects_v2(Bucket=self.server.bucket, Prefix=f"{self.folder}/.")
        return [f"upload {upload['Key']}" for upload in uploads.get("Uploads", [])] + [
            entry["Key"] for entry in markers.get("Contents", [])
        ]


@pytest.fixture
def s3_place(s3_server: S3Server, proxy: FaultProxy, request: pytest.FixtureRequest) -> S3Place:
    return S3Place(s3_server, proxy, f"lab/vmmigrations/ns/{migration_name(request)}")


@pytest.mark.parametrize("refuse_seconds", [0.0, 3.0], ids=["cut", "3s-outage"])
def test_a_cut_or_a_short_outage_mid_transfer_costs_neither_export_nor_import(
    s3_place: S3Place, refuse_seconds: float
) -> None:
    hypervisor = hypervisor_over(s3_staging())
    proxy = s3_place.proxy

    proxy.fail_after(HALF_WAY, refuse_seconds)
    exported = ok(s3_place.export(hypervisor, "disk.raw"))
    assert proxy.outage_began is not None, "the fault never came: the test proves nothing"
    assert exported.checksum == DISK_SHA256
    assert s3_place.stored("disk.raw") == DISK
    assert s3_place.leftovers() == []

    proxy.fail_after(HALF_WAY, refuse_seconds)
    imported = ok(s3_place.import_(hypervisor, "disk.raw", "outage-in"))
    assert proxy.outage_began is not None
    assert imported.checksum == DISK_SHA256
    assert hypervisor.fake.imported["outage-in"] == DISK


def test_an_outage_past_the_budget_is_unavailable_while_it_lasts_and_the_upload_aborted(
    s3_place: S3Place,
) -> None:
    """The budget answers, not the store's return: the outage lasts until the test ends it,
    after the answer. The upload is aborted once the store is back, not by the hourly sweep."""
    staging = s3_staging(SHORT_BUDGET_SECONDS)
    hypervisor = hypervisor_over(staging)
    proxy = s3_place.proxy

    proxy.fail_after(HALF_WAY, OUTAGE_UNTIL_ENDED_SECONDS)
    failed = s3_place.export(hypervisor, "disk.raw")

    assert error_of(failed).kind is ErrorKind.UNAVAILABLE
    assert proxy.outage_began is not None
    assert proxy.outage_ended is None, "the store came back before the answer"
    assert s3_place.stored("disk.raw") is None
    assert s3_place.leftovers() != []  # the abort waits for the store
    assert staging.aborts.pending() == 1
    proxy.end_outage()
    proxy.wait_until_back()
    wait_until(
        lambda: not s3_place.leftovers() and not staging.aborts.pending(),
        ABORT_PATIENCE_SECONDS,
        "the upload aborted once the store was back",
    )
    assert s3_place.stored("disk.raw") is None


# --- NFS -------------------------------------------------------------------------------------


@dataclass
class NfsPlace:
    server: NfsServer
    name_prefix: str

    def url(self, name: str) -> str:
        return f"nfs://{self.server.server}{self.server.export}/{self.name_prefix}-{name}"

    def path(self, name: str) -> Any:
        return self.server.export / f"{self.name_prefix}-{name}"


@pytest.fixture
def nfs_place(nfs_server: NfsServer, request: pytest.FixtureRequest) -> NfsPlace:
    return NfsPlace(nfs_server, f"vmmigrations-ns-{migration_name(request)}")


def test_an_nfs_server_restarted_mid_transfer_costs_neither_export_nor_import(
    nfs_place: NfsPlace,
) -> None:
    hypervisor = hypervisor_over(NfsStaging(owner="tests/outages", **system_time()))
    restarts: list[threading.Thread] = []

    def restart() -> None:
        restarts.append(nfs_place.server.outage(1.0))

    hypervisor.disks.passed = once_past(HALF_WAY, restart)
    exported = ok(
        export_disk(
            hypervisor.moves,
            hypervisor.vm_id,
            nfs_place.url("disk.raw"),
            backend="nfs",
            disk_format="raw",
            options=nfs_options(nfs_place.server),
        )
    )
    assert len(restarts) == 1, "the server never restarted: the test proves nothing"
    restarts[0].join(60)
    assert exported.checksum == DISK_SHA256
    assert nfs_place.path("disk.raw").read_bytes() == DISK

    hypervisor.disks.passed = once_past(HALF_WAY, restart)
    imported = ok(
        import_disk(
            hypervisor.moves,
            nfs_place.url("disk.raw"),
            target_name="outage-in",
            backend="nfs",
            disk_format="raw",
            expected_checksum=DISK_SHA256,
            options=nfs_options(nfs_place.server),
        )
    )
    assert len(restarts) == 2
    restarts[1].join(60)
    assert imported.checksum == DISK_SHA256
    assert hypervisor.fake.imported["outage-in"] == DISK
    leftovers = [p.name for p in nfs_place.server.export.glob(f".{nfs_place.name_prefix}-*")]
    assert leftovers == []
