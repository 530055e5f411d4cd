"""ExportDisk / ImportDisk of a 2 GiB disk through each staging storage, on libvirt and on
vSphere, against a plain copy.

Usage (from the repository root, as root, with the project's venv; needs libvirtd + QEMU,
moto, nfs-ganesha and Go for the vCenter simulator, as the tests do):

    .venv/bin/python bench/migration_bench.py              # 2 GiB, ~30 minutes (moto is slow)
    .venv/bin/python bench/migration_bench.py --gib 0.25 --json out.json
    .venv/bin/python bench/migration_bench.py --storages s3 --libvirt-only

libvirt: a VM is created (pyrigaud's Create) from a raw volume of random bytes in a pool of its
own, so its disk is a qcow2 overlay, as a migrated VM's is. Then, per storage -- a PVC folder,
moto's S3 server and nfs-ganesha, all on loopback, started here the way the tests start them --
the libvirt adapter (in this process, requests read by the wire parsers) exports the disk as
qcow2 and imports it back with checksum verification, side by side with the floor: the same
bytes copied to the same place by the plainest tool (`cp` for the PVC, boto3's own managed
multipart upload/download for S3, libnfs's `nfs-cp` for NFS), from and to a file in the same
pool. Export includes libvirt's flattening of the overlay; import includes staging in a
temporary volume and libvirt's conversion into the final qcow2 volume. A libvirt row also shows
the same bytes through one bare libvirt stream alone (a download of the exported qcow2's volume,
an upload of it into a new volume, nothing staged): the least any transfer takes whose bytes
travel through libvirt's streams, as they must to work over every transport.

vSphere (on the vCenter simulator launcher): per storage, the same random disk staged as raw is
imported (converted in this process into a streamOptimized vmdk, sent through an NFC import
lease), a VM is made around the first import, and its disk is exported as qcow2 and as vmdk
(an NFC export lease's streamOptimized vmdk, converted in this process). A vSphere row's floor
is the libvirt row's floor throughput on the same storage and direction, over the vSphere row's
bytes (the floor copies are the same few GiB either way; moto's floor download alone takes
minutes).

RSS growth is this process's peak resident set during the transfer minus the one before it.
The targets (issue 11): >= 0.8x the floor's throughput, RSS growth < 64 MiB. The script
reports, it does not assert.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import libvirt
from returns.result import Failure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.libvirt.backend import build_libvirt_backend
from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    PoolSettings,
    delete_volume,
    upload_volume,
    volume_xml,
)
from pyrigaud.adapters.staging.registry import staging_by_backend
from pyrigaud.domain.models import CreateRequest, OwnerMark, Placement, VMClass, VMImage

from contract.harness import made
from support import ok
from support.staging import ganesha_nfs, moto_s3
from support.transfer import IMAGE_JUDGE, DiskMoves, disk_moves, export_disk, import_disk
from support.vsphere import backend_over, create_use_case, running_simulator

URI = "qemu:///system"
POOL = "pyrigaud-bench-migration"
POOL_PATH = Path("/var/lib/pyrigaud-test/bench-migration")
OWNER = "bench/migration"
MiB = 1024**2
CHUNK = 4 * MiB
TARGET_FACTOR = 0.8
TARGET_RSS_MIB = 64


@dataclass
class Row:
    hypervisor: str
    storage: str
    direction: str  # "export" or "import"
    disk_format: str  # what was staged
    seconds: float
    floor_seconds: float
    bytes: int
    rss_growth_mib: float
    synced_floor_seconds: float | None = None  # PVC: the floor, then its file fsynced
    streams_seconds: float | None = None  # libvirt: the same bytes through its streams alone

    @property
    def ratio(self) -> float:
        return self.floor_seconds / self.seconds


@dataclass(frozen=True)
class Storage:
    """One staging backend: what the manager sends, and the floor's copy to and from it."""

    kind: str
    url: Callable[[str], str]
    options: dict[str, object]
    credentials: dict[str, str]
    upload: Callable[[Path, str], None]  # the floor: a local file to the staged name
    download: Callable[[str, Path], None]  # the floor: the staged name to a local file
    folder: Path | None = None  # PVC: where the staged names are files


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def measured(action: Callable[[], object]) -> tuple[float, float, object]:
    """Seconds, RSS growth (MiB, peak during minus before) and the action's value."""
    before = rss_bytes()
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        value = action()
    finally:
        took = time.perf_counter() - started
        done.set()
        sampler.join()
    return took, max(peak, rss_bytes()) - before, value


def unwrapped(result: Any) -> Any:
    if isinstance(result, Failure):
        raise RuntimeError(f"failed: {result.failure()}")
    return result.unwrap()


def storages(stack: ExitStack, workdir: Path, root: Path, kinds: list[str]) -> list[Storage]:
    """The storages of `kinds`, in the order they are measured; only their servers start."""
    (root / "mig").mkdir(parents=True)
    pvc = Storage(
        kind="pvc",
        url=lambda name: f"pvc://mig/vmmigrations/ns/bench/{name}",
        options={},
        credentials={},
        upload=lambda source, name: _cp(
            source, root / "mig" / "vmmigrations" / "ns" / "bench" / name
        ),
        download=lambda name, target: _cp(
            root / "mig" / "vmmigrations" / "ns" / "bench" / name, target
        ),
        folder=root / "mig" / "vmmigrations" / "ns" / "bench",
    )
    found = [pvc]
    if "s3" in kinds:
        found.append(_s3(stack, workdir))
    if "nfs" in kinds:  # first: its server registers with a shared rpcbind
        found.insert(0, _nfs(stack, workdir))
    return [place for place in found if place.kind in kinds]


def _s3(stack: ExitStack, workdir: Path) -> Storage:
    (workdir / "moto").mkdir()
    s3_server = stack.enter_context(moto_s3(workdir / "moto"))
    client = s3_server.client()
    return Storage(
        kind="s3",
        url=lambda name: f"s3://{s3_server.bucket}/vmmigrations/ns/bench/{name}",
        options={
            "backend": "s3",
            "bucket": s3_server.bucket,
            "endpoint": s3_server.endpoint,
            "usePathStyle": True,
        },
        credentials={
            "accessKeyID": s3_server.access_key_id,
            "secretAccessKey": s3_server.secret_access_key,
        },
        upload=lambda source, name: client.upload_file(
            str(source), s3_server.bucket, f"vmmigrations/ns/bench/{name}"
        ),
        download=lambda name, target: client.download_file(
            s3_server.bucket, f"vmmigrations/ns/bench/{name}", str(target)
        ),
    )


def _nfs(stack: ExitStack, workdir: Path) -> Storage:
    (workdir / "ganesha").mkdir()
    nfs_server = stack.enter_context(ganesha_nfs(workdir / "ganesha"))
    base = f"nfs://{nfs_server.server}{nfs_server.export}"
    return Storage(
        kind="nfs",
        url=lambda name: f"{base}/vmmigrations-ns-bench-{name}",
        options={"backend": "nfs", "server": nfs_server.server, "export": str(nfs_server.export)},
        credentials={},
        upload=lambda source, name: _nfs_cp(str(source), f"{base}/vmmigrations-ns-bench-{name}"),
        download=lambda name, target: _nfs_cp(f"{base}/vmmigrations-ns-bench-{name}", str(target)),
    )


def _cp(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", str(source), str(target)], check=True)


def _nfs_cp(source: str, target: str) -> None:
    subprocess.run(["nfs-cp", source, target], check=True, stdout=subprocess.DEVNULL)


@contextmanager
def bench_pool(conn: Any) -> Iterator[Any]:
    POOL_PATH.mkdir(parents=True, exist_ok=True)
    try:
        pool = conn.storagePoolLookupByName(POOL)
    except libvirt.libvirtError:
        xml = (
            f"<pool type='dir'><name>{POOL}</name><target><path>{POOL_PATH}</path></target></pool>"
        )
        pool = conn.storagePoolCreateXML(xml, 0)
    try:
        yield pool
    finally:
        for volume in pool.listAllVolumes(0):
            volume.delete(0)
        pool.destroy()
        shutil.rmtree(POOL_PATH, ignore_errors=True)


def run(gib: float, kinds: list[str], libvirt_only: bool) -> list[Row]:
    size = int(gib * 1024**3) // CHUNK * CHUNK
    conn = libvirt.open(URI)
    workdir = Path(tempfile.mkdtemp(prefix="migration-bench-"))
    with ExitStack() as stack:
        stack.callback(conn.close)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        pool = stack.enter_context(bench_pool(conn))
        root = workdir / "migration-storage"
        places = storages(stack, workdir, root, kinds)
        base = pool.createXML(volume_xml("bench-base.raw", size, volume_format="raw"), 0)
        upload_volume(conn, base, (os.urandom(CHUNK) for _ in range(size // CHUNK)))
        connection = LibvirtConnection(URI)
        stack.callback(connection.close)
        clock = SystemClock()
        staging = staging_by_backend(OWNER, clock, str(root))
        backend = build_libvirt_backend(
            connection,
            clock,
            domain_type="qemu",
            pools=PoolSettings(default_pool=POOL, default_pool_path=str(POOL_PATH)),
            allow_loopback_urls=False,
            image_judge=IMAGE_JUDGE,
            staging_backends=staging.backends,
            transfer_owner=OWNER,
        )
        image = VMImage(path=str(base.path()), format="raw")
        request = CreateRequest(
            name="bench-migration", vm_class=VMClass(cpu=1, memory_mib=256), image=image
        )
        vm_id = unwrapped(backend.lifecycle.start_create(request, OwnerMark(provider=OWNER))).id
        vsphere = None
        if not libvirt_only:
            simulator = stack.enter_context(running_simulator())
            vsphere = backend_over(simulator.session(), defaults=Placement(datastore="LocalDS_0"))
        try:
            return _compare(backend, connection, vsphere, staging, places, vm_id, Path(base.path()))
        finally:
            backend.lifecycle.delete(vm_id)


def _compare(
    backend: Any,
    connection: Any,
    vsphere: Any,
    staging: Any,
    places: list[Storage],
    vm_id: str,
    raw: Path,
) -> list[Row]:
    """Per storage, libvirt then vSphere: a storage's rows are measured close together (the
    NFS server's registration with the shared rpcbind lasts only so long beside other tests).
    Without `vsphere`, libvirt's rows alone."""
    rows: list[Row] = []
    floor_file = POOL_PATH / "bench-floor.qcow2"
    vsphere_vm = ""
    for place in places:
        measured_rows = _one_storage(
            disk_moves(backend, staging), connection, place, vm_id, floor_file
        )
        if vsphere is not None:
            floors = {row.direction: row.bytes / row.floor_seconds for row in measured_rows}
            more, vsphere_vm = _vsphere(vsphere, staging, place, raw, floors, vsphere_vm)
            measured_rows += more
        print(report(measured_rows), flush=True)  # as it goes: S3's floor on moto is slow
        rows += measured_rows
    return rows


def _one_storage(
    port: DiskMoves, connection: Any, place: Storage, vm_id: str, floor_file: Path
) -> list[Row]:
    """Export and import through `place`, each beside its floor and libvirt's streams alone."""
    url = place.url("export.qcow2")
    libvirt_row = functools.partial(Row, "libvirt", place.kind)
    seconds, rss, exported = measured(lambda: _export(port, vm_id, place, url, "qcow2"))
    if not floor_file.exists():  # the staged bytes, as a file in the pool
        place.download("export.qcow2", floor_file)
    floor, _, _ = measured(lambda: place.upload(floor_file, "floor.qcow2"))
    synced = floor + _fsync_seconds(place.folder / "floor.qcow2") if place.folder else None
    size = exported.estimated_size_bytes
    streams = ok(connection.call(lambda conn: _download_alone(conn, floor_file)))
    rows = [libvirt_row("export", "qcow2", seconds, floor, size, rss / MiB, synced, streams)]
    seconds, rss, imported = measured(
        lambda: _import(port, place, url, f"bench-{place.kind}", exported.checksum)
    )
    landed = POOL_PATH / "bench-floor-in.qcow2"
    floor, _, _ = measured(lambda: place.download("floor.qcow2", landed))
    synced = floor + _fsync_seconds(landed) if place.folder else None
    landed.unlink()
    ok(connection.call(lambda conn: delete_volume(conn, imported.path)))
    size = imported.actual_size_bytes
    streams = ok(connection.call(lambda conn: _upload_alone(conn, floor_file)))
    rows.append(libvirt_row("import", "qcow2", seconds, floor, size, rss / MiB, synced, streams))
    return rows


STREAM_CHUNK_BYTES = 4 * MiB


def _download_alone(conn: Any, path: Path) -> float:
    """Seconds to read the file's volume through one bare libvirt download stream, dropping
    the bytes: the least any export through libvirt's streams takes (pyrigaud's bytes must
    take that path, whatever the transport)."""
    pool = conn.storagePoolLookupByName(POOL)
    pool.refresh(0)
    volume = conn.storageVolLookupByPath(str(path))
    started = time.perf_counter()
    stream = conn.newStream(0)
    volume.download(stream, 0, 0, 0)
    while stream.recv(STREAM_CHUNK_BYTES):
        pass
    stream.finish()
    return time.perf_counter() - started


def _upload_alone(conn: Any, path: Path) -> float:
    """Seconds to write the file's bytes into a new volume through one bare libvirt upload
    stream: the least any import through libvirt's streams takes."""
    pool = conn.storagePoolLookupByName(POOL)
    size = path.stat().st_size
    volume = pool.createXML(volume_xml("bench-streams-alone.raw", size, volume_format="raw"), 0)
    try:
        started = time.perf_counter()
        stream = conn.newStream(0)
        volume.upload(stream, 0, size, 0)
        with path.open("rb") as source:
            while chunk := source.read(STREAM_CHUNK_BYTES):
                stream.send(chunk)
        stream.finish()
        return time.perf_counter() - started
    finally:
        volume.delete(0)


def _fsync_seconds(path: Path) -> float:
    """How long the fsync of a file the floor just wrote takes: pyrigaud's PVC writer fsyncs
    before its rename, and the `cp` floor does not."""

    def fsync() -> None:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    took, _, _ = measured(fsync)
    return took


def _vsphere(
    backend: Any, staging: Any, place: Storage, raw: Path, floors: dict[str, float], vm_id: str
) -> tuple[list[Row], str]:
    """The raw disk imported through `place`, a VM around it unless `vm_id` names one already,
    its disk exported as qcow2 and vmdk; floors from the libvirt rows' throughput. The rows
    and the VM's id."""
    port = disk_moves(backend, staging)

    def row(direction: str, disk_format: str, took: tuple[float, float], size: int) -> Row:
        seconds, rss = took
        floor = size / floors[direction]
        return Row("vsphere", place.kind, direction, disk_format, seconds, floor, size, rss / MiB)

    place.upload(raw, "vsphere-in.raw")
    url = place.url("vsphere-in.raw")
    seconds, rss, imported = measured(lambda: _import(port, place, url, f"bench-{place.kind}", ""))
    rows = [row("import", "raw", (seconds, rss), imported.actual_size_bytes)]
    vm_id = vm_id or _vm_around(backend, imported.path)
    for disk_format in ("qcow2", "vmdk"):
        out = place.url(f"vsphere-out.{disk_format}")
        seconds, rss, exported = measured(
            lambda: _export(port, vm_id, place, out, disk_format)  # noqa: B023
        )
        rows.append(row("export", disk_format, (seconds, rss), exported.estimated_size_bytes))
    return rows, vm_id


def _vm_around(backend: Any, disk_path: str) -> str:
    request = CreateRequest(
        name="bench-migration",
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=VMImage(path=disk_path, format="vmdk"),
    )
    owner = OwnerMark(provider=OWNER)
    return made(backend.tasks, create_use_case(backend, owner)(request))


def _export(port: Any, vm_id: str, place: Storage, url: str, disk_format: str) -> Any:
    return unwrapped(
        export_disk(
            port,
            vm_id,
            url,
            backend=place.kind,
            disk_format=disk_format,
            options=place.options,
            credentials=place.credentials,
        )
    )


def _import(port: Any, place: Storage, url: str, target_name: str, checksum: str) -> Any:
    return unwrapped(
        import_disk(
            port,
            url,
            target_name=target_name,
            backend=place.kind,
            expected_checksum=checksum,
            options=place.options,
            credentials=place.credentials,
        )
    )


def report(rows: list[Row]) -> str:
    lines = [
        "| hypervisor | storage | op | pyrigaud | floor | ratio | floor + fsync "
        "| libvirt streams alone | RSS growth |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        mib_s = row.bytes / MiB / row.seconds
        floor_mib_s = row.bytes / MiB / row.floor_seconds
        met = row.ratio >= TARGET_FACTOR and row.rss_growth_mib < TARGET_RSS_MIB
        synced = (
            f"{row.synced_floor_seconds:.1f} s ({row.synced_floor_seconds / row.seconds:.2f}x)"
            if row.synced_floor_seconds is not None
            else "-"
        )
        streams = (
            f"{row.streams_seconds:.1f} s ({row.streams_seconds / row.seconds:.2f}x)"
            if row.streams_seconds is not None
            else "-"
        )
        lines.append(
            f"| {row.hypervisor} | {row.storage} | {row.direction} {row.disk_format} "
            f"| {row.seconds:.1f} s ({mib_s:.0f} MiB/s) "
            f"| {row.floor_seconds:.1f} s ({floor_mib_s:.0f} MiB/s) | {row.ratio:.2f}x"
            f"{'' if met else ' (below target)'} | {synced} | {streams} "
            f"| {row.rss_growth_mib:.1f} MiB |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--storages",
        nargs="+",
        choices=("nfs", "pvc", "s3"),
        default=["nfs", "pvc", "s3"],
        help="measure only these storages (only their servers are started)",
    )
    parser.add_argument(
        "--libvirt-only",
        action="store_true",
        help="only libvirt's rows: no vCenter simulator",
    )
    arguments = parser.parse_args()
    rows = run(arguments.gib, arguments.storages, arguments.libvirt_only)
    print("\nAll rows:")
    print(report(rows))
    if arguments.json:
        arguments.json.write_text(json.dumps([asdict(row) for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
