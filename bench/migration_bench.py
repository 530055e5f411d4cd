"""A VMMigration's disk moves on the manager's own path, beside the floors each must pass through.

Usage (from the repository root, as root, with the project's venv; needs libvirtd + QEMU, moto,
nfs-ganesha and Go for the vCenter simulator, as the tests do):

    .venv/bin/python bench/migration_bench.py                  # 2 GiB, the whole matrix
    .venv/bin/python bench/migration_bench.py --gib 0.25 --storages pvc --states running
    .venv/bin/python bench/migration_bench.py --s3-gib 0.5 --json out.json

What runs is what the manager runs (docs/migration.md), over gRPC against two served
`pyrigaud serve` processes, one per backend (libvirt on libvirtd + QEMU, vSphere on the
simulator), each the source or the target as the direction says: a source VM, running (then a
disk-only SnapshotCreate, and an ExportDisk at that snapshot) or powered off (an ExportDisk of
the disk as it is); the ExportDisk to the staging URL the manager builds (a PVC folder, moto's
S3 server, nfs-ganesha; all on loopback); an ImportDisk on the other backend with the export's
checksum to verify; a Create from the imported Path. Two disks: random bytes, and a typical
mostly-empty guest disk (MOSTLY_EMPTY_DATA: data at the start and a little spread over the
rest, zeros between). A row's time runs from the RPC to its task's end, polled every 50 ms.

Floors, measured in the same run on the same bytes (the staged file, fetched once the export
is done): (a) one bare libvirt volume stream between the pool and this process (a download of
a volume holding the staged bytes for an export, an upload of them into a new volume for an
import); (b) one SHA-256 pass over them; (c) the plain copy to the staging store for an export
(`cp` + fsync for the PVC, libnfs's `nfs-cp` for NFS, and for S3 a plain multipart upload at
pyrigaud's own part size and parts in flight) and from it for an import (`cp`, `nfs-cp`, and
for S3 one plain GET read in pyrigaud's chunk size, as pyrigaud reads); (d) for vSphere one
bare NFC lease stream (an export lease's GET of the source's disk, or an import lease's PUT of
the staged disk as the streamOptimized vmdk vCenter takes, made beforehand by qemu-img). A
row's ratio is the slowest of its floors' seconds over its own: 1.0 means as fast as the
slowest thing it must do anyway; beside it, the serial sum of its floors' seconds (each step
done alone, one after the other) and its ratio to that sum.

With --rounds N each case runs N times in a row, the floors after pyrigaud's transfers in the
first round and before them in the next (alternating): in a floors-first round the export's
floors run on the previous round's staged bytes (the same disk, exported the same way) before
the export, and the import's right before the import. The summary gives each row's range
(min-max) over the rounds. RSS growth is the serving provider process's peak resident set during
the transfer (VmHWM, reset by writing 5 to /proc/<pid>/clear_refs before it) minus its resident
set before; qemu-img's children are not counted. Before the table, each provider makes one
transfer of a small disk through each store (the warm-up, reported apart): what a process
loads once, at its first transfer through a store (boto3 and S3's model, about 40 MiB), is
then not counted as any row's growth. Beside each row, the CPU cores kept busy during it: by
the serving process (with the qemu-img runs it waited for) and by the whole machine (libvirtd,
QEMU, the simulator and the stores too), and the idle cores with disk I/O outstanding: a
machine near all its cores is bound by CPU, one with cores waiting for I/O by its disk,
whatever the floors measured alone say.

Targets (issue 27): ratio >= 0.8, RSS growth < 64 MiB. The script reports, it does not assert.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pyVmomi import vim

from pyrigaud.adapters.hypervisors.vsphere.nfc_export import export_disk
from pyrigaud.adapters.hypervisors.vsphere.nfc_lease import (
    LeaseProgress,
    ready_lease_info,
    send_to_lease,
)
from pyrigaud.adapters.staging.s3_upload import PART_BYTES, PARTS_IN_FLIGHT, part_plan
from pyrigaud.adapters.staging.streams import CHUNK_BYTES
from pyrigaud.domain.errors import ProviderError
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support import ok
from support.migration import NAMESPACE, PVC, Storage, manager_image_json
from support.ova import OVF_TEMPLATE
from support.qemu import QEMU_URI, ensure_dir_pool, open_qemu, remove_pool_leftovers
from support.replica import Replica
from support.staging import (
    NfsServer,
    S3Server,
    ganesha_nfs,
    manager_nfs_options,
    manager_s3_options,
    moto_s3,
)
from support.vsphere import SIMULATOR_DATASTORE, Simulator, running_simulator, vm_ref

POOL = "pyrigaud-bench-migration"
POOL_PATH = Path("/var/lib/pyrigaud-test/bench-migration")
PREFIX = "pyrigaud-bench-"
MiB = 1024**2
CHUNK = 4 * MiB
STREAM_CHUNK = 1 * MiB
POLL_SECONDS = 0.05
CALL_SECONDS = 1800
CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256})
TARGET_RATIO = 0.8
TARGET_RSS_MIB = 64
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The mostly-empty guest disk: its first MiBs written (boot and root file system), then one MiB
# every so often (files spread over the rest), zeros between: about a tenth of it holds data.
MOSTLY_EMPTY_HEAD = 64 * MiB
MOSTLY_EMPTY_EVERY = 16 * MiB
WARM_UP = "Warm-up: each provider's first transfer through each store (not in the table)"


@dataclass(frozen=True)
class Case:
    source: str  # "libvirt" or "vsphere"
    staging: str  # "pvc", "s3" or "nfs"
    disk: str  # "random" or "mostly-empty"
    running: bool

    @property
    def target(self) -> str:
        return "vsphere" if self.source == "libvirt" else "libvirt"

    @property
    def name(self) -> str:
        state = "running" if self.running else "off"
        return f"{PREFIX}{self.source[0]}2{self.target[0]}-{self.staging}-{self.disk}-{state}"

    @property
    def import_format(self) -> str:
        """The staged format ImportDisk names, as the manager does (docs/migration.md)."""
        return "vmdk" if self.staging == "s3" and self.source == "vsphere" else "qcow2"


@dataclass
class Floor:
    name: str
    seconds: float
    bytes: int


@dataclass
class Row:
    case: str
    op: str  # "export" (on the source) or "import" (on the target)
    provider: str
    seconds: float
    bytes: int  # the staged file's
    rss_growth_mib: float
    provider_cores: float
    machine_cores: float
    io_wait_cores: float
    floors: list[Floor] = field(default_factory=list)
    others: dict[str, float] = field(default_factory=dict)  # seconds of the other calls
    floors_first: bool = False  # the floors ran before pyrigaud's transfer

    @classmethod
    def of(
        cls,
        case: str,
        op: str,
        provider: str,
        transfer: Measured,
        size: int,
        floors: list[Floor],
        others: dict[str, float],
        floors_first: bool,
    ) -> Row:
        return cls(
            case,
            op,
            provider,
            transfer.seconds,
            size,
            transfer.rss_growth_mib,
            transfer.provider_cores,
            transfer.machine_cores,
            transfer.io_wait_cores,
            floors,
            others,
            floors_first,
        )

    @property
    def slowest(self) -> Floor:
        return max(self.floors, key=lambda floor: floor.seconds)

    @property
    def ratio(self) -> float:
        return self.slowest.seconds / self.seconds

    @property
    def serial_seconds(self) -> float:
        """The floors one after the other: each step of the row done alone, in turn."""
        return sum(floor.seconds for floor in self.floors)

    @property
    def serial_ratio(self) -> float:
        return self.serial_seconds / self.seconds


# --- the provider processes -------------------------------------------------------------------


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for {pid}")


@dataclass(frozen=True)
class Measured:
    """One transfer, measured: its seconds, the serving process's RSS growth (peak during
    minus before, MiB), and the cores it and the whole machine kept busy meanwhile."""

    seconds: float
    rss_growth_mib: float
    provider_cores: float  # the process and the children it waited for (qemu-img)
    machine_cores: float  # every process: libvirtd, QEMU, the simulator, the stores too
    io_wait_cores: float  # idle cores with a disk write or read outstanding
    value: Any


def process_cpu_seconds(pid: int) -> float:
    """CPU time of `pid`, with that of the children it has waited for (/proc/<pid>/stat:
    utime, stime, cutime, cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return sum(int(tick) for tick in fields[11:15]) / CLOCK_TICKS


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, waiting for I/O) CPU seconds of the machine since boot, every core summed
    (/proc/stat: user, nice, system, idle, iowait, irq, softirq, steal)."""
    ticks = [int(tick) for tick in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(ticks[:8]) - ticks[3] - ticks[4]
    return busy / CLOCK_TICKS, ticks[4] / CLOCK_TICKS


def measured(pid: int, action: Callable[[], Any]) -> Measured:
    """`action` run and measured against the serving process `pid` (module docstring)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status_kib(pid, "VmRSS")
    cpu_before, (busy_before, waiting_before) = process_cpu_seconds(pid), machine_cpu_seconds()
    started = time.perf_counter()
    value = action()
    took = time.perf_counter() - started
    cpu, (busy, waiting) = process_cpu_seconds(pid) - cpu_before, machine_cpu_seconds()
    return Measured(
        took,
        (status_kib(pid, "VmHWM") - before) / 1024,
        cpu / took,
        (busy - busy_before) / took,
        (waiting - waiting_before) / took,
        value,
    )


@contextmanager
def profiled(pid: int, output: Path | None) -> Iterator[None]:
    """With `output`, py-spy samples the process (idle threads too: waiting on a stream is
    where a transfer's time may go) while the block runs, and the stacks land in `output`
    (py-spy's raw, collapsed format)."""
    if output is None:
        yield
        return
    command = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid)]
    command += ["--idle", "--rate", "50", "--format", "raw", "--output", str(output)]
    sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)
        sampler.wait(timeout=60)


def transfer_stacks(output: Path, top: int = 12) -> str:
    """Where the transfer's threads spent their samples, by innermost frame: the lines of
    `output` whose stack passes through a use case (ExportDisk, ImportDisk) or an adapter's
    disk transfer."""
    leaves: dict[str, int] = {}
    total = 0
    for line in output.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "use_cases" not in stack and "disk_transfer" not in stack:
            continue
        leaf = stack.rsplit(";", 1)[-1]
        leaves[leaf] = leaves.get(leaf, 0) + int(count)
        total += int(count)
    ranked = sorted(leaves.items(), key=lambda item: -item[1])[:top]
    return "\n".join(f"  {count * 100 / total:5.1f}%  {leaf}" for leaf, count in ranked)


def settled(stub: pb_grpc.ProviderStub, task: pb.TaskRef) -> None:
    """The task (if any) polled until done, as the manager polls it (only more often)."""
    if not task.id:
        return
    deadline = time.monotonic() + CALL_SECONDS
    while time.monotonic() < deadline:
        status = stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=30)
        if status.done:
            if status.error:
                raise RuntimeError(f"task {task.id} failed: {status.error}")
            return
        time.sleep(POLL_SECONDS)
    raise RuntimeError(f"task {task.id} not done in {CALL_SECONDS} s")


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = action()
    return time.perf_counter() - started, value


# --- the places and their floors --------------------------------------------------------------


@dataclass
class Places:
    """The servers a run started, and the shared PVC root (PYRIGAUD_MIGRATION_STORAGE_ROOT)."""

    root: Path
    conn: Any
    simulator: Simulator
    s3: S3Server | None = None
    nfs: NfsServer | None = None

    def storage(self, case: Case) -> Storage:
        """The staging URL, options and credentials the manager derives for the migration."""
        folder = f"vmmigrations/{NAMESPACE}/{case.name}"
        if case.staging == "pvc":
            return Storage("pvc", f"pvc://{PVC}/{folder}/export.qcow2")
        if case.staging == "s3":
            assert self.s3 is not None
            options, credentials = manager_s3_options(self.s3)
            return Storage(
                "s3", f"s3://{self.s3.bucket}/{folder}/export.vmdk", options, credentials
            )
        assert self.nfs is not None
        name = f"vmmigrations-{NAMESPACE}-{case.name}-export.qcow2"
        return Storage(
            "nfs", f"nfs://{self.nfs.server}{self.nfs.export}/{name}", manager_nfs_options(self.nfs)
        )

    def fetch(self, storage: Storage, target: Path) -> float:
        """Floor (c) of an import: the staged file copied out by the plainest tool; seconds."""
        if storage.backend_type == "pvc":
            source = self.root / PVC / storage.url.removeprefix(f"pvc://{PVC}/")
            return timed(lambda: _cp_synced(source, target))[0]
        if storage.backend_type == "s3":
            assert self.s3 is not None
            bucket, key = storage.url.removeprefix("s3://").split("/", 1)
            client = self.s3.client()
            return timed(lambda: _s3_get(client, bucket, key, target))[0]
        return timed(lambda: _nfs_cp(storage.url, str(target)))[0]

    def put(self, storage: Storage, source: Path) -> float:
        """Floor (c) of an export: the same bytes written beside the staged file; seconds."""
        if storage.backend_type == "pvc":
            target = self.root / PVC / storage.url.removeprefix(f"pvc://{PVC}/")
            floor = target.with_name("floor.qcow2")
            took = timed(lambda: _cp_synced(source, floor))[0]
            floor.unlink()
            return took
        if storage.backend_type == "s3":
            assert self.s3 is not None
            bucket, key = storage.url.removeprefix("s3://").split("/", 1)
            client = self.s3.client()
            took = timed(lambda: _s3_put(client, source, bucket, f"{key}.floor"))[0]
            client.delete_object(Bucket=bucket, Key=f"{key}.floor")
            return took
        # A fresh name each time: ganesha still knows a name removed beneath it, and refuses
        # to create it again (NFS3ERR_EXIST) when the next round's floor writes it.
        suffix = f".floor-{os.urandom(4).hex()}"
        took = timed(lambda: _nfs_cp(str(source), f"{storage.url}{suffix}"))[0]
        staged = self.staged_nfs_file(storage)
        staged.with_name(staged.name + suffix).unlink()
        return took

    def remove_staged(self, storage: Storage) -> None:
        if storage.backend_type == "pvc":
            shutil.rmtree(self.root / PVC / "vmmigrations", ignore_errors=True)
        elif storage.backend_type == "s3":
            assert self.s3 is not None
            bucket, key = storage.url.removeprefix("s3://").split("/", 1)
            self.s3.client().delete_object(Bucket=bucket, Key=key)
        else:
            self.staged_nfs_file(storage).unlink(missing_ok=True)

    def staged_nfs_file(self, storage: Storage) -> Path:
        assert self.nfs is not None
        return self.nfs.export / storage.url.rsplit("/", 1)[1]


def _cp_synced(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", str(source), str(target)], check=True)
    descriptor = os.open(target, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _s3_get(client: Any, bucket: str, key: str, target: Path) -> None:
    """As pyrigaud reads a staged object: one GET, read CHUNK_BYTES at a time."""
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    with target.open("wb") as out:
        while chunk := body.read(CHUNK_BYTES):
            out.write(chunk)


def _s3_put(client: Any, source: Path, bucket: str, key: str) -> None:
    """As pyrigaud writes one: a multipart upload of pyrigaud's part size, PARTS_IN_FLIGHT
    parts uploading on threads while the next one is read; nothing else (no hashing)."""
    part_bytes = part_plan(source.stat().st_size, PART_BYTES).first_part_bytes
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

    def sent(number: int, part: bytes) -> dict[str, Any]:
        answer = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=part
        )
        return {"PartNumber": number, "ETag": answer["ETag"]}

    parts: list[dict[str, Any]] = []
    in_flight: collections.deque[Future[dict[str, Any]]] = collections.deque()
    with ThreadPoolExecutor(PARTS_IN_FLIGHT) as uploads, source.open("rb") as reader:
        number = 0
        while part := reader.read(part_bytes):
            if len(in_flight) == PARTS_IN_FLIGHT:
                parts.append(in_flight.popleft().result())
            number += 1
            in_flight.append(uploads.submit(sent, number, part))
        parts += [future.result() for future in in_flight]
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )


def _nfs_cp(source: str, target: str) -> None:
    subprocess.run(["nfs-cp", source, target], check=True, stdout=subprocess.DEVNULL)


def sha256_seconds(path: Path) -> float:
    """Floor (b): one SHA-256 pass over the file."""

    def digest() -> str:
        hasher = hashlib.sha256()
        with path.open("rb") as source:
            while chunk := source.read(CHUNK):
                hasher.update(chunk)
        return hasher.hexdigest()

    return timed(digest)[0]


def libvirt_download_seconds(conn: Any, staged: Path) -> float:
    """Floor (a) of an export: a volume holding the staged bytes read through one bare
    libvirt download stream, the bytes dropped."""
    held = POOL_PATH / f"{PREFIX}floor.img"
    shutil.copyfile(staged, held)
    pool = ensure_dir_pool(conn, POOL, POOL_PATH)
    volume = conn.storageVolLookupByPath(str(held))

    def download() -> None:
        stream = conn.newStream(0)
        volume.download(stream, 0, 0, 0)
        while stream.recv(STREAM_CHUNK):
            pass
        stream.finish()

    try:
        return timed(download)[0]
    finally:
        volume.delete(0)
        pool.refresh(0)


def libvirt_upload_seconds(conn: Any, staged: Path) -> float:
    """Floor (a) of an import: the staged bytes written into a new volume through one bare
    libvirt upload stream."""
    pool = ensure_dir_pool(conn, POOL, POOL_PATH)
    size = staged.stat().st_size
    xml = (
        f"<volume><name>{PREFIX}floor-in.img</name><capacity>{size}</capacity>"
        "<target><format type='raw'/></target></volume>"
    )
    volume = pool.createXML(xml, 0)

    def upload() -> None:
        stream = conn.newStream(0)
        volume.upload(stream, 0, size, 0)
        with staged.open("rb") as source:
            while chunk := source.read(STREAM_CHUNK):
                stream.send(chunk)
        stream.finish()

    try:
        return timed(upload)[0]
    finally:
        volume.delete(0)


def nfc_export_seconds(places: Places, vm_id: str, running: bool) -> tuple[float, int]:
    """Floor (d) of a vSphere export: the source's disk read through one bare NFC export
    lease (at its snapshot when it runs), the bytes dropped; seconds and bytes."""
    with vcenter(places.simulator) as instance:
        vm = vm_ref(instance, vm_id)
        source = vm.snapshot.currentSnapshot if running else vm

        def read() -> int:
            moved = 0
            with ExitStack() as holds:
                for chunk in ok(export_disk(instance, source, 0, holds)).chunks():
                    moved += len(chunk)
            return moved

        return timed(read)


@contextmanager
def vcenter(simulator: Simulator) -> Iterator[Any]:
    """A pyvmomi service instance over a session of the bench's own, for one floor (an idle
    one's kept-alive connection may be gone by the next)."""
    session = simulator.session()
    try:
        yield session.call(lambda instance: instance)
    finally:
        session.close()


def nfc_import_seconds(places: Places, staged: Path, workdir: Path) -> tuple[float, int]:
    """Floor (d) of a vSphere import: the staged disk, made a streamOptimized vmdk by qemu-img
    beforehand, sent through one bare NFC import lease (the VM it makes is destroyed after);
    seconds and the vmdk's bytes."""
    vmdk = workdir / "floor.vmdk"
    subprocess.run(
        [
            "qemu-img",
            "convert",
            "-O",
            "vmdk",
            "-o",
            "subformat=streamOptimized",
            str(staged),
            str(vmdk),
        ],
        check=True,
    )
    capacity = json.loads(
        subprocess.run(
            ["qemu-img", "info", "--output=json", str(staged)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )["virtual-size"]
    size = vmdk.stat().st_size
    descriptor = OVF_TEMPLATE.format(disk="disk1.vmdk", size=size, capacity=capacity)
    with vcenter(places.simulator) as instance:
        return _nfc_import(instance, vmdk, descriptor, size)


def _nfc_import(instance: Any, vmdk: Path, descriptor: str, size: int) -> tuple[float, int]:
    datacenter = instance.content.rootFolder.childEntity[0]
    cluster = datacenter.hostFolder.childEntity[0]
    datastore = next(store for store in datacenter.datastore if store.name == SIMULATOR_DATASTORE)
    spec = instance.content.ovfManager.CreateImportSpec(
        ovfDescriptor=descriptor,
        resourcePool=cluster.resourcePool,
        datastore=datastore,
        cisp=vim.OvfManager.CreateImportSpecParams(
            entityName=f"{PREFIX}nfc-floor", diskProvisioning="thin"
        ),
    )

    def send() -> Any:
        lease = cluster.resourcePool.ImportVApp(spec=spec.importSpec, folder=datacenter.vmFolder)
        info = ok(ready_lease_info(instance, lease, ProviderError.failed_precondition))
        progress = LeaseProgress(lease, size)
        with vmdk.open("rb") as reader:
            ok(
                send_to_lease(
                    instance._stub,
                    info.deviceUrl[0].url,
                    create=True,
                    size=size,
                    reader=reader,
                    progress=progress,
                )
            )
        lease.HttpNfcLeaseComplete()
        return info.entity

    try:
        took, made = timed(send)
    finally:
        vmdk.unlink()
    task = made.Destroy_Task()
    while task.info.state not in ("success", "error"):
        time.sleep(POLL_SECONDS)
    return took, size


# --- the source disks and VMs -----------------------------------------------------------------


def disk_file(workdir: Path, kind: str, size: int) -> Path:
    """The disk's bytes as a raw file (sparse where it is zeros), made once per kind and size."""
    path = workdir / f"{kind}-{size}.raw"
    if path.exists():
        return path
    with path.open("wb") as out:
        if kind == "random":
            for _ in range(size // CHUNK):
                out.write(os.urandom(CHUNK))
        else:
            out.write(os.urandom(MOSTLY_EMPTY_HEAD))
            for offset in range(MOSTLY_EMPTY_HEAD, size, MOSTLY_EMPTY_EVERY):
                out.seek(offset)
                out.write(os.urandom(MiB))
        out.truncate(size)
    return path


def create(stub: pb_grpc.ProviderStub, name: str, image_json: str) -> str:
    made = stub.Create(
        pb.CreateRequest(name=name, class_json=CLASS_JSON, image_json=image_json),
        timeout=CALL_SECONDS,
    )
    settled(stub, made.task)
    return str(made.id)


def libvirt_source(
    places: Places, stub: pb_grpc.ProviderStub, name: str, raw: Path, base_format: str
) -> str:
    """A VM growing from a base volume holding the disk: raw, as the matrix test makes one,
    or qcow2, as a cloud image is."""
    base = POOL_PATH / f"{name}-base.{base_format}"
    if base_format == "raw":
        subprocess.run(["cp", "--sparse=always", str(raw), str(base)], check=True)
    else:
        subprocess.run(
            ["qemu-img", "convert", "-f", "raw", "-O", base_format, str(raw), str(base)],
            check=True,
        )
    ensure_dir_pool(places.conn, POOL, POOL_PATH)
    return create(stub, name, json.dumps({"Path": str(base), "Format": base_format}))


def vsphere_source(places: Places, stub: pb_grpc.ProviderStub, name: str, raw: Path) -> str:
    """A VM made around a datastore disk holding the disk, landed by ImportDisk from the PVC."""
    seed = places.root / PVC / "seeds" / f"{name}.raw"
    seed.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "--sparse=always", str(raw), str(seed)], check=True)
    landed = stub.ImportDisk(
        pb.ImportDiskRequest(
            source_url=f"pvc://{PVC}/seeds/{seed.name}",
            format="raw",
            target_name=f"{name}-disk",
            backend_type="pvc",
            transfer_mode="relay",
        ),
        timeout=CALL_SECONDS,
    )
    settled(stub, landed.task)
    seed.unlink()
    return create(stub, name, manager_image_json(landed.path, "vmdk"))


def floors_of_export(
    case: Case, places: Places, storage: Storage, staged: Path, vm_id: str
) -> list[Floor]:
    """An export's floors on the staged bytes: SHA-256, the store's write, and the source's
    own stream (libvirt's download, or vSphere's NFC export lease of the source VM)."""
    size = staged.stat().st_size
    floors = [
        Floor("sha256", sha256_seconds(staged), size),
        Floor(f"{case.staging} write", places.put(storage, staged), size),
    ]
    if case.source == "libvirt":
        floors.append(Floor("libvirt stream", libvirt_download_seconds(places.conn, staged), size))
    else:
        nfc, nfc_bytes = nfc_export_seconds(places, vm_id, case.running)
        floors.append(Floor("NFC lease", nfc, nfc_bytes))
    return floors


def floors_of_import(
    case: Case, places: Places, storage: Storage, staged: Path, workdir: Path
) -> list[Floor]:
    """An import's floors: the store's read (which leaves the staged bytes in `staged`),
    SHA-256 over them, and the target's own stream (libvirt's upload, or vSphere's NFC import
    lease)."""
    fetch = places.fetch(storage, staged)
    size = staged.stat().st_size
    floors = [
        Floor(f"{case.staging} read", fetch, size),
        Floor("sha256", sha256_seconds(staged), size),
    ]
    if case.target == "libvirt":
        floors.append(Floor("libvirt stream", libvirt_upload_seconds(places.conn, staged), size))
    else:
        nfc, nfc_bytes = nfc_import_seconds(places, staged, workdir)
        floors.append(Floor("NFC lease", nfc, nfc_bytes))
    return floors


# --- one migration ----------------------------------------------------------------------------


def migrate(
    case: Case,
    places: Places,
    providers: dict[str, Replica],
    raw: Path,
    workdir: Path,
    profiles: Path | None,
    base_format: str = "raw",
    keep: Path | None = None,
    floors_first: bool = False,
) -> list[Row]:
    """The manager's sequence for `case`, timed, beside the floors on the staged bytes: after
    each transfer or, `floors_first`, before it (the export's on the earlier round's staged
    bytes of the same case, kept in `keep`). This round's staged bytes are kept there too.
    With `profiles`, each transfer's py-spy stacks land there (and its figures include py-spy's
    cost)."""
    source, target = providers[case.source], providers[case.target]
    storage = places.storage(case)
    made: list[tuple[pb_grpc.ProviderStub, str]] = []
    snapshot = ""
    staged = workdir / "staged"
    try:
        if case.source == "libvirt":
            vm_id = libvirt_source(places, source.stub, f"{case.name}-src", raw, base_format)
        else:
            vm_id = vsphere_source(places, source.stub, f"{case.name}-src", raw)
        made.append((source.stub, vm_id))
        export_others: dict[str, float] = {}
        op = pb.POWER_OP_ON if case.running else pb.POWER_OP_OFF
        powered = source.stub.Power(pb.PowerRequest(id=vm_id, op=op), timeout=CALL_SECONDS)
        settled(source.stub, powered.task)
        if case.running:

            def snapshot_create() -> str:
                taken = source.stub.SnapshotCreate(
                    pb.SnapshotCreateRequest(
                        vm_id=vm_id, name_hint=f"{case.name}-migration", include_memory=False
                    ),
                    timeout=CALL_SECONDS,
                )
                settled(source.stub, taken.task)
                return str(taken.snapshot_id)

            export_others["SnapshotCreate"], snapshot = timed(snapshot_create)
        if floors_first:
            if keep is None or not keep.exists():
                raise ValueError("a floors-first round follows one that kept its bytes")
            export_floors = floors_of_export(case, places, storage, keep, vm_id)

        def export() -> Any:
            exported = source.stub.ExportDisk(
                pb.ExportDiskRequest(
                    vm_id=vm_id,
                    snapshot_id=snapshot,
                    destination_url=storage.url,
                    format="qcow2",
                    **storage.fields(),
                ),
                timeout=CALL_SECONDS,
            )
            settled(source.stub, exported.task)
            return exported

        with profiled(source.pid, profiles and profiles / f"{case.name}-export.txt"):
            export_measured = measured(source.pid, export)
        exported = export_measured.value
        if floors_first:
            import_floors = floors_of_import(case, places, storage, staged, workdir)

        def import_() -> Any:
            imported = target.stub.ImportDisk(
                pb.ImportDiskRequest(
                    source_url=storage.url,
                    format=case.import_format,
                    target_name=f"{case.name}-dst-migrated",
                    verify_checksum=True,
                    expected_checksum=exported.checksum,
                    **storage.fields(),
                ),
                timeout=CALL_SECONDS,
            )
            settled(target.stub, imported.task)
            return imported

        with profiled(target.pid, profiles and profiles / f"{case.name}-import.txt"):
            import_measured = measured(target.pid, import_)
        imported = import_measured.value
        if imported.checksum != exported.checksum:
            raise RuntimeError(f"{case.name}: the import's checksum is not the export's")
        label = "vmdk" if case.target == "vsphere" else "qcow2"
        image_json = manager_image_json(imported.path, label)
        create_seconds, migrated = timed(
            lambda: create(target.stub, f"{case.name}-dst", image_json)
        )
        made.append((target.stub, migrated))

        if not floors_first:
            import_floors = floors_of_import(case, places, storage, staged, workdir)
            export_floors = floors_of_export(case, places, storage, staged, vm_id)
        size = staged.stat().st_size
        if keep is not None:
            staged.replace(keep)
        return [
            Row.of(
                case.name,
                "export",
                case.source,
                export_measured,
                size,
                export_floors,
                export_others,
                floors_first,
            ),
            Row.of(
                case.name,
                "import",
                case.target,
                import_measured,
                size,
                import_floors,
                {"Create": create_seconds},
                floors_first,
            ),
        ]
    finally:
        staged.unlink(missing_ok=True)
        if snapshot:  # the manager's cleanup, after the floors (the NFC one reads it)
            deleted = source.stub.SnapshotDelete(
                pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=snapshot), timeout=CALL_SECONDS
            )
            settled(source.stub, deleted.task)
        for stub, made_id in reversed(made):
            deleted = stub.Delete(pb.DeleteRequest(id=made_id), timeout=CALL_SECONDS)
            settled(stub, deleted.task)
        places.remove_staged(storage)
        remove_pool_leftovers(places.conn, POOL, POOL_PATH)


# --- the run ----------------------------------------------------------------------------------


@contextmanager
def started(
    workdir: Path, kinds: list[str], code: Path | None
) -> Iterator[tuple[Places, dict[str, Replica]]]:
    """The pool, the simulator, the staging servers of `kinds` and one provider per backend,
    running the installed pyrigaud or, with `code`, the package found there first."""
    with ExitStack() as stack:
        conn = open_qemu()
        stack.callback(conn.close)
        remove_pool_leftovers(conn, POOL, POOL_PATH)
        stack.callback(_remove_pool, conn)
        simulator = stack.enter_context(running_simulator())
        root = workdir / "migration-storage"
        (root / PVC).mkdir(parents=True)
        places = Places(root, conn, simulator)
        if "nfs" in kinds:
            (workdir / "ganesha").mkdir()
            places.nfs = stack.enter_context(ganesha_nfs(workdir / "ganesha"))
        if "s3" in kinds:
            (workdir / "moto").mkdir()
            places.s3 = stack.enter_context(moto_s3(workdir / "moto"))
        common = {"PROVIDER_NAMESPACE": NAMESPACE, "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(root)}
        if code is not None:
            common["PYTHONPATH"] = str(code)
        libvirt_environ = {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": QEMU_URI,
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PROVIDER_DEFAULT_DATASTORE": POOL,
            "PROVIDER_NAME": f"{PREFIX}libvirt",
            **common,
        }
        vsphere_environ = simulator.serve_environ(
            PROVIDER_DEFAULT_DATASTORE=SIMULATOR_DATASTORE,
            PROVIDER_NAME=f"{PREFIX}vsphere",
            **common,
        )
        ensure_dir_pool(conn, POOL, POOL_PATH)
        providers: dict[str, Replica] = {}
        for backend, environ in (("libvirt", libvirt_environ), ("vsphere", vsphere_environ)):
            providers[backend] = Replica(environ, workdir / backend)
            stack.callback(providers[backend].stop)
        yield places, providers


def _remove_pool(conn: Any) -> None:
    remove_pool_leftovers(conn, POOL, POOL_PATH)
    pool = conn.storagePoolLookupByName(POOL)
    pool.destroy()
    pool.undefine()
    shutil.rmtree(POOL_PATH, ignore_errors=True)


def warmed(
    places: Places, providers: dict[str, Replica], arguments: argparse.Namespace, workdir: Path
) -> list[Row]:
    """Each provider's first export and import through each store, of a small disk: what a
    serving process loads once, at its first transfer through a store (boto3 and S3's model,
    about 40 MiB; libnfs's context), is then in before the table's rows measure theirs."""
    rows: list[Row] = []
    if arguments.warm_up_mib == 0:
        return rows
    raw = disk_file(workdir, "mostly-empty", arguments.warm_up_mib * MiB)
    for staging in arguments.storages:
        for source in arguments.sources:
            case = Case(source, staging, "mostly-empty", running=False)
            rows += migrate(case, places, providers, raw, workdir, None, arguments.base_format)
    return rows


def run(arguments: argparse.Namespace) -> tuple[list[Row], list[Row]]:
    """The warm-up's rows, then the table's."""
    cases = [
        Case(source, staging, disk, state == "running")
        for staging in arguments.storages  # NFS first: its rpcbind registration is the shortest
        for disk in arguments.disks
        for state in arguments.states
        for source in arguments.sources
    ]
    workdir = Path(tempfile.mkdtemp(prefix=PREFIX))
    rows: list[Row] = []
    warm_up: list[Row] = []
    try:
        with started(workdir, arguments.storages, arguments.code) as (places, providers):
            warm_up = warmed(places, providers, arguments, workdir)
            print(f"{WARM_UP}:\n{report(warm_up)}", flush=True)
            keep = workdir / "kept.qcow2" if arguments.rounds > 1 else None
            for case in cases:
                gib = arguments.s3_gib if case.staging == "s3" else arguments.gib
                size = int(gib * 1024**3) // CHUNK * CHUNK
                raw = disk_file(workdir, case.disk, size)
                for round_index in range(arguments.rounds):
                    measured = migrate(
                        case,
                        places,
                        providers,
                        raw,
                        workdir,
                        arguments.profile,
                        arguments.base_format,
                        keep,
                        floors_first=round_index % 2 == 1,
                    )
                    print(report(measured), flush=True)
                    if arguments.profile:
                        for op in ("export", "import"):
                            stacks = transfer_stacks(arguments.profile / f"{case.name}-{op}.txt")
                            print(f"{case.name} {op}, samples by innermost frame:\n{stacks}")
                    rows += measured
                if keep is not None:
                    keep.unlink(missing_ok=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return warm_up, rows


FLOOR_COLUMNS = ("libvirt stream", "sha256", "store", "NFC lease")


def report(rows: list[Row]) -> str:
    """The rows as a Markdown table: each floor's throughput on its own bytes, the ratio to
    the slowest (named) and the RSS growth, then the other calls' seconds."""
    lines = [
        "| migration | op | pyrigaud | (a) libvirt stream | (b) SHA-256 | (c) store "
        "| (d) NFC lease | ratio to the slowest floor | serial sum of floors | ratio to the sum "
        "| RSS growth | cores busy: pyrigaud / all (waiting for I/O) | first | other calls |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        by_column = {_column(floor.name): floor for floor in row.floors}
        cells = [
            f"{floor.bytes / MiB / floor.seconds:.0f} MiB/s" if floor else "-"
            for floor in (by_column.get(column) for column in FLOOR_COLUMNS)
        ]
        met = row.ratio >= TARGET_RATIO and row.rss_growth_mib < TARGET_RSS_MIB
        others = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in row.others.items())
        lines.append(
            f"| {row.case.removeprefix(PREFIX)} | {row.op} ({row.provider}) "
            f"| {row.seconds:.1f} s ({row.bytes / MiB / row.seconds:.0f} MiB/s) "
            f"| {' | '.join(cells)} | {row.ratio:.2f}x ({row.slowest.name})"
            f"{'' if met else ' below target'} | {row.serial_seconds:.1f} s "
            f"| {row.serial_ratio:.2f}x | {row.rss_growth_mib:.1f} MiB "
            f"| {row.provider_cores:.2f} / {row.machine_cores:.2f} ({row.io_wait_cores:.2f}) "
            f"| {'floors' if row.floors_first else 'pyrigaud'} | {others} |"
        )
    return "\n".join(lines)


def ranges(rows: list[Row]) -> str:
    """Each row's range (min-max) over its rounds: pyrigaud's seconds, its ratio to the
    slowest floor and to the serial sum of its floors, and the largest RSS growth."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.case, row.op, row.provider), []).append(row)
    lines = [
        "| migration | op | rounds | pyrigaud s | ratio to the slowest floor "
        "| ratio to the serial sum | RSS growth, most |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (case, op, provider), group in groups.items():

        def span(values: list[float], unit: str) -> str:
            return f"{min(values):.2f}-{max(values):.2f}{unit}"

        lines.append(
            f"| {case.removeprefix(PREFIX)} | {op} ({provider}) | {len(group)} "
            f"| {span([row.seconds for row in group], ' s')} "
            f"| {span([row.ratio for row in group], 'x')} "
            f"| {span([row.serial_ratio for row in group], 'x')} "
            f"| {max(row.rss_growth_mib for row in group):.1f} MiB |"
        )
    return "\n".join(lines)


def _column(floor_name: str) -> str:
    """A floor's column: the store's copy (to it or from it) or the floor's own name."""
    return "store" if floor_name.endswith((" write", " read")) else floor_name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2, help="the disk's size")
    parser.add_argument(
        "--s3-gib", type=float, default=2, help="the disk's size through S3 (moto is slow)"
    )
    parser.add_argument(
        "--storages", nargs="+", choices=("nfs", "pvc", "s3"), default=["nfs", "pvc", "s3"]
    )
    parser.add_argument(
        "--disks", nargs="+", choices=("random", "mostly-empty"), default=["random", "mostly-empty"]
    )
    parser.add_argument(
        "--states", nargs="+", choices=("running", "off"), default=["running", "off"]
    )
    parser.add_argument(
        "--sources",
        nargs="+",
        choices=("libvirt", "vsphere"),
        default=["libvirt", "vsphere"],
        help="libvirt: libvirt -> vSphere",
    )
    parser.add_argument(
        "--base-format",
        choices=("raw", "qcow2"),
        default="raw",
        help="the libvirt source VM's base image (qcow2: as one grown from a cloud image)",
    )
    parser.add_argument(
        "--warm-up-mib",
        type=int,
        default=128,
        help="the warm-up's disk (mostly empty); 0: no warm-up",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of each case in a row, the floors first in every second one",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--code",
        type=Path,
        help="a folder holding a `pyrigaud` package (e.g. a link to a changed src/) the "
        "providers run instead of the installed one: a change measured against it",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="a folder for py-spy's stacks of each transfer (py-spy installed in the venv)",
    )
    arguments = parser.parse_args()
    if arguments.profile:
        arguments.profile.mkdir(parents=True, exist_ok=True)
    warm_up, rows = run(arguments)
    print(f"\n{WARM_UP}:\n{report(warm_up)}\n\nAll rows:\n{report(rows)}")
    print(f"\nRanges over {arguments.rounds} round(s) per case:\n{ranges(rows)}")
    if arguments.json:
        figures = {
            "warm_up": [{**asdict(row), "ratio": row.ratio} for row in warm_up],
            "rows": [
                {**asdict(row), "ratio": row.ratio, "serial_ratio": row.serial_ratio}
                for row in rows
            ],
        }
        arguments.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
