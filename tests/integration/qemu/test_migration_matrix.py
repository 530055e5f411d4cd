"""The manager's VMMigration walked over gRPC between two `pyrigaud serve` processes, in every
direction between the libvirt backend (libvirtd + QEMU) and the vSphere backend (the simulator),
through each staging backend (a PVC folder, moto's S3 server, nfs-ganesha on loopback), from a
powered-off source and from a running one; at the end the target VM's disk, read back past the
provider, holds exactly the bytes the source's disk held.

The requests are the manager's (docs/migration.md): GetCapabilities on both (the Validating gate);
for a powered-off source (`powerOffBeforeMigration: true`, `createSnapshot: false`) Power OFF and
an export of the disk as it is; for a running one (the CRD defaults: `createSnapshot: true`,
`powerOffBeforeMigration: false`) a disk-only SnapshotCreate and an export at that snapshot_id
(on QEMU the disk is written over after the snapshot, so only an export of the snapshot's state
passes; the source must still run after its export). One more case walks a running UEFI
source from libvirt to libvirt, whose snapshot is an external overlay (libvirt refuses an
internal snapshot of a running VM with pflash firmware). ExportDisk asks for qcow2; ImportDisk
names the staged format as the manager does (pvc: the diskFormat, qcow2; s3: vmdk when the source
provider is vSphere, else qcow2; nfs: qcow2) with the export's checksum to verify; Create takes
the manager's six-key image_json around the imported Path, labelled vmdk on a vSphere target and
qcow2 on libvirt; SnapshotDelete cleans up.

The source disk is random bytes: on libvirt a raw base volume the VM grows from, on vSphere a
disk landed by ImportDisk that the VM is made around. The target disk is read back through
GetDiskInfo's path: a libvirt volume by qemu-img (which follows its backing chain), a vSphere
datastore file through the datastore's HTTP file access, then converted by qemu-img.
"""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import libvirt_qemu
import pytest

from pyrigaud.adapters.hypervisors.libvirt.storage import upload_volume, volume_xml
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.migration import (
    PVC,
    TRANSFER_SECONDS,
    manager_image_json,
    manager_storage,
    settled,
)
from support.ova import read_datastore_file
from support.qemu import QEMU_URI, ensure_dir_pool, swept_pool_connection
from support.replica import Replica
from support.vsphere import SIMULATOR_DATASTORE, Simulator, shared_simulator

pytestmark = pytest.mark.timeout(600)

POOL = "pyrigaud-matrix"
POOL_PATH = Path("/var/lib/pyrigaud-test/matrix")
DISK_BYTES = 4 * 1024**2
LATER_BYTES = 64 * 1024  # written over the disk's start once the snapshot is taken
CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256})
UEFI_CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256, "Firmware": "UEFI"})
CALL_SECONDS = 300  # the manager's deadline for Create and the snapshot calls

BACKENDS = ("libvirt", "vsphere")
STAGINGS = ("pvc", "s3", "nfs")


@dataclass(frozen=True)
class Case:
    source: str
    target: str
    staging: str
    running: bool
    uefi: bool = False  # a source with UEFI firmware, whose snapshots are external overlays

    @property
    def name(self) -> str:
        power = "running" if self.running else "off"
        return (
            f"{self.source}-to-{self.target}-{self.staging}-{power}{'-uefi' if self.uefi else ''}"
        )

    @property
    def import_format(self) -> str:
        """The staged format ImportDisk names (generateStorageURL's caller, docs/migration.md)."""
        if self.staging == "s3" and self.source == "vsphere":
            return "vmdk"
        return "qcow2"

    @property
    def target_label(self) -> str:
        """The format the manager writes into the target VM's image_json."""
        return "vmdk" if self.target == "vsphere" else "qcow2"


CASES = [
    Case(source, target, staging, running)
    for source in BACKENDS
    for target in BACKENDS
    for staging in STAGINGS
    for running in (False, True)
]
# libvirt refuses internal snapshots of a running UEFI VM: the manager's sequence still works.
CASES.append(Case("libvirt", "libvirt", "pvc", running=True, uefi=True))


@pytest.fixture(scope="module")
def conn() -> Iterator[Any]:
    """A raw connection for the source's base volumes and reading disks; the pool is swept."""
    yield from swept_pool_connection(POOL, POOL_PATH)


@pytest.fixture(scope="module")
def migration_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PVC every provider pod mounts."""
    return tmp_path_factory.mktemp("migration-storage")


@pytest.fixture(scope="module")
def simulator() -> Simulator:
    return shared_simulator()


@pytest.fixture(scope="module")
def vcenter(simulator: Simulator) -> Iterator[Any]:
    """A pyvmomi connection, for the datastore's HTTP file access."""
    session = simulator.session()
    yield session.call(lambda instance: instance)
    session.close()


@pytest.fixture(scope="module")
def providers(
    conn: Any,
    migration_root: Path,
    simulator: Simulator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[tuple[str, str], Replica]]:
    """A source and a target provider per backend: four processes sharing the PVC."""
    ensure_dir_pool(conn, POOL, POOL_PATH)
    common = {
        "PROVIDER_NAMESPACE": "ns",
        "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(migration_root),
    }
    started: dict[tuple[str, str], Replica] = {}
    try:
        for role in ("source", "target"):
            libvirt_environ = {
                "PROVIDER_TYPE": "libvirt",
                "PROVIDER_ENDPOINT": QEMU_URI,
                "LIBVIRT_DOMAIN_TYPE": "qemu",
                "PROVIDER_DEFAULT_DATASTORE": POOL,
                "PROVIDER_NAME": f"libvirt-{role}",
                **common,
            }
            vsphere_environ = simulator.serve_environ(
                PROVIDER_DEFAULT_DATASTORE=SIMULATOR_DATASTORE,
                PROVIDER_NAME=f"vsphere-{role}",
                **common,
            )
            home = tmp_path_factory.mktemp(role)
            started["libvirt", role] = Replica(libvirt_environ, home / "libvirt")
            started["vsphere", role] = Replica(vsphere_environ, home / "vsphere")
        yield started
    finally:
        codes = {key: replica.stop() for key, replica in started.items()}
        assert set(codes.values()) <= {0}, codes


def _create(
    stub: pb_grpc.ProviderStub, name: str, image_json: str, class_json: str = CLASS_JSON
) -> str:
    created = stub.Create(
        pb.CreateRequest(name=name, class_json=class_json, image_json=image_json),
        timeout=CALL_SECONDS,
    )
    settled(stub, created.task)
    return str(created.id)


def _libvirt_source(
    conn: Any, stub: pb_grpc.ProviderStub, name: str, content: bytes, class_json: str
) -> str:
    """A VM growing from a raw base volume holding `content`."""
    pool = ensure_dir_pool(conn, POOL, POOL_PATH)
    base = pool.createXML(volume_xml(f"{name}-base.raw", len(content), volume_format="raw"), 0)
    upload_volume(conn, base, [content])
    image_json = json.dumps({"Path": str(base.path()), "Format": "raw"})
    return _create(stub, name, image_json, class_json)


def _vsphere_source(stub: pb_grpc.ProviderStub, root: Path, name: str, content: bytes) -> str:
    """A VM made around a datastore disk holding `content`, landed by ImportDisk from the PVC."""
    seed = f"seeds/{name}.raw"
    (root / PVC / "seeds").mkdir(parents=True, exist_ok=True)
    (root / PVC / seed).write_bytes(content)
    landed = stub.ImportDisk(
        pb.ImportDiskRequest(
            source_url=f"pvc://{PVC}/{seed}",
            format="raw",
            target_name=f"{name}-disk",
            backend_type="pvc",
            transfer_mode="relay",
        ),
        timeout=TRANSFER_SECONDS,
    )
    settled(stub, landed.task)
    return _create(stub, name, manager_image_json(landed.path, "vmdk"))


def _write_later(case: Case, conn: Any, vm_id: str, scratch: Path) -> None:
    """LATER_BYTES of 0x5a over the start of the running source's disk, once the snapshot is
    taken: what an export at the snapshot must not hold. QEMU writes them through its monitor's
    qemu-io into the disk's own device (the guest has no OS to write with); the disk read back
    shows them. The simulator cannot: its snapshots make no delta disk (the VM writes on into
    the file its snapshot names), so there the export is checked against the base alone."""
    if case.source != "libvirt":
        return
    dom = conn.lookupByUUIDString(vm_id)
    live = ET.fromstring(dom.XMLDesc(0))
    alias, path = live.find("devices/disk/alias"), live.find("devices/disk/source")
    assert alias is not None
    assert path is not None
    device = f"/machine/peripheral/{alias.get('name')}/virtio-backend"  # the disk's QOM path
    for command in (f"write -P 0x5a 0 {LATER_BYTES}", "flush"):
        libvirt_qemu.qemuMonitorCommand(
            dom,
            f'qemu-io -d {device} "{command}"',
            libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP,
        )
    now = _raw_image(path.get("file", ""), scratch)
    assert now[:LATER_BYTES] == b"\x5a" * LATER_BYTES, "qemu-io did not write"


def _raw_image(path: str, scratch: Path) -> bytes:
    """The disk an image file holds, as qemu-img reads it (backing chain included), even while
    QEMU has it open."""
    raw = scratch / "disk.raw"
    subprocess.run(
        ["qemu-img", "convert", "-U", "-O", "raw", path, str(raw)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    content = raw.read_bytes()
    raw.unlink()
    return content


def _target_disk(case: Case, path: str, simulator: Simulator, vcenter: Any, scratch: Path) -> bytes:
    """The content of the target VM's disk at GetDiskInfo's `path`: a volume on the libvirt
    host, a file the simulator's datastore serves."""
    if case.target == "libvirt":
        return _raw_image(path, scratch)
    image = scratch / "disk.vmdk"
    image.write_bytes(read_datastore_file(simulator, vcenter, path))
    return _raw_image(str(image), scratch)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_managers_migration_moves_the_disk_between_two_providers(
    case: Case,
    providers: dict[tuple[str, str], Replica],
    conn: Any,
    simulator: Simulator,
    vcenter: Any,
    migration_root: Path,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    source = providers[case.source, "source"].stub
    target = providers[case.target, "target"].stub
    storage = manager_storage(case.staging, case.name, request, migration_root)
    content = os.urandom(DISK_BYTES)
    made: list[tuple[pb_grpc.ProviderStub, str]] = []
    snapshot = ""
    try:
        if case.source == "libvirt":
            class_json = UEFI_CLASS_JSON if case.uefi else CLASS_JSON
            vm_id = _libvirt_source(conn, source, f"{case.name}-src", content, class_json)
        else:
            vm_id = _vsphere_source(source, migration_root, f"{case.name}-src", content)
        made.append((source, vm_id))
        for stub, backends in (
            (source, "supported_export_backends"),
            (target, "supported_import_backends"),
        ):  # the Validating phase's gate
            caps = stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=10)
            assert case.staging in getattr(caps, backends)
            assert list(caps.supported_transfer_modes) == ["relay"]

        if case.running:
            powered = source.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_ON), timeout=120)
            settled(source, powered.task)
            taken = source.SnapshotCreate(
                pb.SnapshotCreateRequest(
                    vm_id=vm_id, name_hint=f"{case.name}-migration", include_memory=False
                ),
                timeout=CALL_SECONDS,
            )
            settled(source, taken.task)
            snapshot = taken.snapshot_id
            _write_later(case, conn, vm_id, tmp_path)
        else:
            powered = source.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_OFF), timeout=120)
            settled(source, powered.task)

        exported = source.ExportDisk(
            pb.ExportDiskRequest(
                vm_id=vm_id,
                disk_id="",
                snapshot_id=snapshot,
                destination_url=storage.url,
                format="qcow2",
                compress=False,
                **storage.fields(),
            ),
            timeout=TRANSFER_SECONDS,
        )
        settled(source, exported.task)
        assert exported.export_id
        if case.running:
            described = source.Describe(pb.DescribeRequest(id=vm_id), timeout=10)
            assert described.power_state == "On", "the export stopped the source"
        target_name = f"{case.name}-dst"
        imported = target.ImportDisk(
            pb.ImportDiskRequest(
                source_url=storage.url,
                storage_hint="",
                format=case.import_format,
                target_name=f"{target_name}-migrated",
                verify_checksum=True,
                expected_checksum=exported.checksum,
                **storage.fields(),
            ),
            timeout=TRANSFER_SECONDS,
        )
        settled(target, imported.task)
        assert imported.disk_id
        assert imported.checksum == exported.checksum
        image_json = manager_image_json(imported.path, case.target_label)
        migrated = _create(target, target_name, image_json)
        made.append((target, migrated))
        if snapshot:  # the manager's cleanup
            deleted = source.SnapshotDelete(
                pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=snapshot), timeout=CALL_SECONDS
            )
            settled(source, deleted.task)

        disk = target.GetDiskInfo(pb.GetDiskInfoRequest(vm_id=migrated), timeout=120)
        moved = _target_disk(case, disk.path, simulator, vcenter, tmp_path)
        assert len(moved) == len(content)
        assert moved == content, "the target's disk does not hold the source's bytes"
    finally:
        for stub, made_id in reversed(made):
            try:
                stub.Delete(pb.DeleteRequest(id=made_id), timeout=120)
            except grpc.RpcError as error:  # reported, without hiding the test's own failure
                print(f"Delete {made_id}: {error.code()} {error.details()}")
