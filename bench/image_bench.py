"""Disk images judged and converted on import and export, against `qemu-img convert` of the same
bytes in the same run.

Usage (from the repository root, as root, with the project's venv; needs libvirtd + QEMU and
Go for the vCenter simulator, as the tests do):

    .venv/bin/python bench/image_bench.py               # a 2 GiB disk of random bytes
    .venv/bin/python bench/image_bench.py --gib 0.25 --json out.json

A raw disk of random bytes is staged on a PVC folder as qcow2 and as a streamOptimized vmdk
(made by qemu-img). Each row is one ImportDisk or ExportDisk through the application's use
cases, beside its floor: the one `qemu-img convert` that turns the same input into the same
kind of output on the same disks, which any provider that converts at all must at least run.

- libvirt import (qcow2 or vmdk staged): the image judged as it streams, uploaded through a
  libvirt stream and converted by libvirt into the pool's qcow2. Floor: `qemu-img convert` of
  the staged file into a qcow2 in the pool's folder.
- libvirt export at a snapshot (the manager's path: a disk-only snapshot, then ExportDisk at
  it): `qemu-img convert -l snapshot.name=` in the pod, hashed and staged. Floor: the same
  `qemu-img convert` of the VM's disk into a qcow2 on the PVC.
- vSphere import (qcow2 or vmdk staged): a qcow2 read by qemu-img into raw and encoded as
  streamOptimized, a vmdk read whole by qemu; then through an NFC import lease. Floor:
  `qemu-img convert` of the staged file into a streamOptimized vmdk (vCenter's input) for a
  qcow2, qemu reading it whole for a vmdk.
- vSphere export as qcow2: the NFC export lease's streamOptimized vmdk decoded as it streams
  and written as qcow2. Floor: `qemu-img convert` of that vmdk (exported as vmdk) into qcow2.

Within a round the rows alternate which of the two runs first (pyrigaud or the floor), and with
--rounds N each round flips the order of the one before, so every row has each order in two
rounds; the summary gives each row's range (min-max) over the rounds.

The script reports, it does not assert; the target is no row slower than the one conversion
qemu-img runs (ratio >= 1 is faster than qemu-img).
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
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from adapter_kit import (
    CHUNK,
    OWNER,
    POOL,
    POOL_PATH,
    URI,
    MiB,
    PvcFolder,
    bench_pool,
    measured,
    unwrapped,
)

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.libvirt.backend import build_libvirt_backend
from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings, upload_volume, volume_xml
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.application.backend import Backend
from pyrigaud.domain.models import (
    CreateRequest,
    DiskQuery,
    OwnerMark,
    Placement,
    SnapshotRequest,
    VMClass,
    VMImage,
)

from contract.harness import made
from support import present
from support.transfer import IMAGE_JUDGE, disk_moves, export_disk, import_disk
from support.vsphere import SIMULATOR_DATASTORE, backend_over, create_use_case, running_simulator

T = TypeVar("T")


@dataclass
class Row:
    hypervisor: str
    operation: str  # e.g. "import qcow2"
    seconds: float
    floor_seconds: float
    bytes: int
    rss_growth_mib: float
    floor_first: bool

    @property
    def ratio(self) -> float:
        return self.floor_seconds / self.seconds


def qemu_img(*arguments: str | Path) -> None:
    subprocess.run(["qemu-img", *map(str, arguments)], check=True, capture_output=True)


def timed(action: Callable[[], object]) -> float:
    seconds, _, _ = measured(action)
    return seconds


@dataclass
class Order:
    """Which of pyrigaud and the floor runs first, flipped at each row."""

    floor_first: bool

    def side_by_side(
        self, ours: Callable[[], T], floor: Callable[[], object]
    ) -> tuple[float, float, T, float, bool]:
        """pyrigaud's seconds, RSS growth and value, the floor's seconds, and whether the
        floor ran first; the next call runs the other first."""
        floor_first = self.floor_first
        self.floor_first = not floor_first
        floor_seconds = timed(floor) if floor_first else 0.0
        seconds, rss, value = measured(ours)
        if not floor_first:
            floor_seconds = timed(floor)
        return seconds, rss, value, floor_seconds, floor_first


def run(gib: float, order: Order) -> list[Row]:
    size = int(gib * 1024**3) // CHUNK * CHUNK
    workdir = Path(tempfile.mkdtemp(prefix="pyrigaud-bench-images-", dir="/var/tmp"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        conn, pool = stack.enter_context(bench_pool())
        root = workdir / "migration-storage"
        place = PvcFolder(root)
        raw = workdir / "disk.raw"
        with raw.open("wb") as disk:
            for _ in range(size // CHUNK):
                disk.write(os.urandom(CHUNK))
        place.folder.mkdir(parents=True, exist_ok=True)
        qemu_img("convert", "-f", "raw", "-O", "qcow2", raw, place.folder / "in.qcow2")
        stream_optimized = ("-o", "subformat=streamOptimized")
        qemu_img(
            "convert", "-f", "raw", "-O", "vmdk", *stream_optimized, raw, place.folder / "in.vmdk"
        )
        staging = STAGING_TYPES.stores(OWNER, SystemClock(), str(root))
        rows = _libvirt(stack, conn, pool, place, staging, raw, size, order)
        print(report(rows), flush=True)
        rows += _vsphere(stack, place, staging, order)
        return rows


def _libvirt(
    stack: ExitStack,
    conn: Any,
    pool: Any,
    place: PvcFolder,
    staging: Any,
    raw: Path,
    size: int,
    order: Order,
) -> list[Row]:
    connection = LibvirtConnection(URI)
    stack.callback(connection.close)
    backend = build_libvirt_backend(
        connection,
        SystemClock(),
        domain_type="qemu",
        pools=PoolSettings(default_pool=POOL, default_pool_path=str(POOL_PATH)),
        allow_loopback_urls=False,
        image_judge=IMAGE_JUDGE,
        transfer_owner=OWNER,
    )
    moves = disk_moves(backend, staging)
    row = functools.partial(Row, "libvirt")
    folder = place.folder
    rows = []
    for staged in ("qcow2", "vmdk"):
        url = place.url(f"in.{staged}")
        staged_import = functools.partial(
            import_disk, moves, url, target_name=f"bench-in-{staged}", disk_format=staged
        )
        floor_file = POOL_PATH / f"bench-floor-{staged}.qcow2"
        source = folder / f"in.{staged}"
        convert: list[str | Path] = ["convert", "-f", staged, "-O", "qcow2", source, floor_file]
        seconds, rss, imported, floor, first = order.side_by_side(
            lambda: unwrapped(staged_import()),  # noqa: B023
            lambda: qemu_img(*convert),  # noqa: B023
        )
        floor_file.unlink()
        size_in = imported.actual_size_bytes
        rows.append(row(f"import {staged}", seconds, floor, size_in, rss / MiB, first))
    base = pool.createXML(volume_xml("bench-base.raw", size, volume_format="raw"), 0)
    with raw.open("rb") as raw_bytes:
        upload_volume(conn, base, iter(lambda: raw_bytes.read(CHUNK), b""))
    request = CreateRequest(
        name="pyrigaud-bench-images",
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=VMImage(path=str(base.path()), format="raw"),
    )
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request, OwnerMark(provider=OWNER)))
    try:
        snapshot = unwrapped(
            present(backend.snapshots).create_snapshot(SnapshotRequest(vm_id=vm_id, name="bench"))
        )
        disk = unwrapped(present(backend.disk_transfer).disk_details(DiskQuery(vm_id=vm_id))).path
        url = place.url("out.qcow2")
        at_snapshot = ["-U", "-l", f"snapshot.name={snapshot.id}", "-O", "qcow2"]
        seconds, rss, exported, floor, first = order.side_by_side(
            lambda: unwrapped(
                export_disk(moves, vm_id, url, disk_format="qcow2", snapshot_id=snapshot.id)
            ),
            lambda: qemu_img("convert", *at_snapshot, disk, folder / "floor.qcow2"),
        )
        size_out = exported.estimated_size_bytes
        rows.append(row("export qcow2 at a snapshot", seconds, floor, size_out, rss / MiB, first))
    finally:
        backend.lifecycle.delete(vm_id)
    return rows


def _vsphere(stack: ExitStack, place: PvcFolder, staging: Any, order: Order) -> list[Row]:
    session = stack.enter_context(running_simulator()).session()
    stack.callback(session.close)  # before the simulator stops: the inventory feed ends with it
    placement = Placement(datastore=SIMULATOR_DATASTORE)
    backend = backend_over(session, defaults=placement, owner=OWNER)
    moves = disk_moves(backend, staging)
    row = functools.partial(Row, "vsphere")
    folder = place.folder
    rows = []
    stream_optimized: list[str | Path] = ["-O", "vmdk", "-o", "subformat=streamOptimized"]
    read_whole: list[str | Path] = ["-n", "-f", "vmdk", "--target-image-opts", folder / "in.vmdk"]
    null_sink = f"driver=null-co,size={_virtual_size(folder / 'in.vmdk')}"
    into_vmdk: list[str | Path] = [
        "-f",
        "qcow2",
        *stream_optimized,
        folder / "in.qcow2",
        folder / "floor.vmdk",
    ]
    floors = {
        "qcow2": lambda: qemu_img("convert", *into_vmdk),
        "vmdk": lambda: qemu_img("convert", *read_whole, null_sink),
    }
    imported_path = ""
    for staged in ("qcow2", "vmdk"):
        url = place.url(f"in.{staged}")
        staged_import = functools.partial(
            import_disk, moves, url, target_name=f"bench-in-{staged}", disk_format=staged
        )
        seconds, rss, imported, floor, first = order.side_by_side(
            lambda: unwrapped(staged_import()),  # noqa: B023
            floors[staged],
        )
        imported_path = imported_path or imported.path
        size_in = imported.actual_size_bytes
        rows.append(row(f"import {staged}", seconds, floor, size_in, rss / MiB, first))
    vm_id = _vsphere_vm_around(backend, imported_path)
    unwrapped(export_disk(moves, vm_id, place.url("out.vmdk"), disk_format="vmdk"))
    seconds, rss, exported, floor, first = order.side_by_side(
        lambda: unwrapped(export_disk(moves, vm_id, place.url("out.qcow2"), disk_format="qcow2")),
        lambda: qemu_img(
            "convert", "-f", "vmdk", "-O", "qcow2", folder / "out.vmdk", folder / "floor.qcow2"
        ),
    )
    size_out = exported.estimated_size_bytes
    rows.append(row("export qcow2", seconds, floor, size_out, rss / MiB, first))
    return rows


def _vsphere_vm_around(backend: Backend, disk_path: str) -> str:
    """A VM made (the provider's Create, its task awaited) around an imported vmdk."""
    request = CreateRequest(
        name="pyrigaud-bench-images",
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=VMImage(path=disk_path, format="vmdk"),
    )
    return made(backend.tasks, create_use_case(backend, OwnerMark(provider=OWNER))(request))


def _virtual_size(path: Path) -> int:
    info = subprocess.run(
        ["qemu-img", "info", "--output=json", str(path)], check=True, capture_output=True
    )
    return int(json.loads(info.stdout)["virtual-size"])


def report(rows: list[Row]) -> str:
    lines = [
        "| hypervisor | operation | pyrigaud | qemu-img convert | ratio | RSS growth | first |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.hypervisor} | {row.operation} | {row.seconds:.1f} s "
            f"| {row.floor_seconds:.1f} s | {row.ratio:.2f}x | {row.rss_growth_mib:.0f} MiB "
            f"| {'qemu-img' if row.floor_first else 'pyrigaud'} |"
        )
    return "\n".join(lines)


def ranges(rows: list[Row]) -> str:
    """Each row's range (min-max) over the rounds."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.hypervisor, row.operation), []).append(row)
    lines = [
        "| hypervisor | operation | rounds | pyrigaud | qemu-img convert | ratio | RSS growth |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (hypervisor, operation), group in groups.items():
        ours = [row.seconds for row in group]
        floors = [row.floor_seconds for row in group]
        ratios = [row.ratio for row in group]
        rss = [row.rss_growth_mib for row in group]
        lines.append(
            f"| {hypervisor} | {operation} | {len(group)} | {min(ours):.1f}-{max(ours):.1f} s "
            f"| {min(floors):.1f}-{max(floors):.1f} s | {min(ratios):.2f}-{max(ratios):.2f}x "
            f"| {min(rss):.0f}-{max(rss):.0f} MiB |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="whole runs, each in the other order")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    rows: list[Row] = []
    for round_index in range(arguments.rounds):
        this_round = run(arguments.gib, Order(floor_first=round_index % 2 == 1))
        print(f"Round {round_index + 1}:\n{report(this_round)}\n", flush=True)
        rows += this_round
    print(f"Ranges over {arguments.rounds} round(s):\n{ranges(rows)}")
    if arguments.json:
        arguments.json.write_text(json.dumps([asdict(row) for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
