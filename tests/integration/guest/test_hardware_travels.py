"""A migrated VM boots: guests born on one hypervisor, whose initramfs holds only the drivers
of the hardware they were born on (the test guest's hardware variants), travel by the
manager's VMMigration sequence over gRPC and find their disk and network on the other side.

vSphere (the simulator) -> libvirt (QEMU): a vSphere-born guest (its VM on the simulator has
the guest's controller and NIC, made from a hardware manifest staged beside its disk as a
vSphere export writes one) is powered on, snapshotted disk-only, exported at the snapshot,
imported with the checksum and made with a class saying BIOS, as the CRD's default does; it
must print its disk and network markers through its own drivers on QEMU. Over pvc, S3 and
NFS, one hardware set each; the same guest given libvirt's native devices (virtio) must not
find its disk, which proves the test can fail. A UEFI-only guest whose manifest is removed
(an upstream source writes none) still boots by UEFI: judged from its disk.

libvirt -> vSphere: the simulator runs no guest, so the target VM's devices and firmware are
read back from it: a KVM-born (virtio) guest gets the devices chosen for it (a fallback,
counted), a UEFI guest gets UEFI with and without its manifest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.application.hardware_manifest import MANIFEST_SUFFIX, render
from pyrigaud.domain.hardware import DiskController, Firmware, NicModel, VirtualHardware
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.guest import DISK, HARDWARE, NET, READY, console, guest_image
from support.migration import (
    PVC,
    TRANSFER_SECONDS,
    Storage,
    manager_image_json,
    manager_storage,
    settled,
)
from support.replica import Replica
from support.staging import NfsServer, S3Server
from support.vsphere import shared_simulator

pytestmark = pytest.mark.timeout(1800)

BOOT_SECONDS = 300  # bounds on waits (software emulation on two busy cores), not speed checks
MARKER_SECONDS = 240
# The VMClass CRD's default firmware: what the manager sends when nobody chose one.
BIOS_CLASS = json.dumps({"CPU": 1, "MemoryMiB": 256, "Firmware": "BIOS"})
UEFI_CLASS = json.dumps({"CPU": 1, "MemoryMiB": 256, "Firmware": "UEFI"})
NATIVE_CLASS = json.dumps(
    {"CPU": 1, "MemoryMiB": 256, "Firmware": "BIOS", "ExtraConfig": {"pyrigaud.devices": "native"}}
)
FALLBACKS = "pyrigaud_hardware_fallbacks_total{"
VSPHERE_NETWORK = json.dumps([{"NetworkName": "VM Network"}])

# What each variant's guest was born with on vSphere (its manifest), and where it travels.
BORN_ON_VSPHERE = {
    "pvscsi": (DiskController.PVSCSI, NicModel.VMXNET3, "pvc"),
    "lsisas": (DiskController.LSI_LOGIC_SAS, NicModel.E1000E, "s3"),
    "ahci": (DiskController.SATA, NicModel.E1000, "nfs"),
}


class Made:
    """The VMs a test made, deleted at its end whatever happened."""

    def __init__(self) -> None:
        self.vms: list[tuple[pb_grpc.ProviderStub, str]] = []

    def create(
        self, stub: pb_grpc.ProviderStub, name: str, class_json: str, path: str, **more: Any
    ) -> str:
        created = stub.Create(
            pb.CreateRequest(
                name=name,
                class_json=class_json,
                image_json=manager_image_json(path, "qcow2"),
                **more,
            ),
            timeout=300,
        )
        settled(stub, created.task)
        self.vms.append((stub, created.id))
        return str(created.id)

    def delete_all(self) -> None:
        for stub, vm_id in reversed(self.vms):
            settled(stub, stub.Delete(pb.DeleteRequest(id=vm_id), timeout=300).task)


@pytest.fixture
def made() -> Iterator[Made]:
    vms = Made()
    yield vms
    vms.delete_all()


def _staged_path(storage: Storage, migration_root: Path, request: pytest.FixtureRequest) -> Any:
    """Where a staged object's bytes are, for the test to put or take them as another party
    would: a local path (a PVC, the NFS export's directory) or the S3 key."""
    if storage.backend_type == "pvc":
        return migration_root / PVC / storage.url.removeprefix(f"pvc://{PVC}/")
    if storage.backend_type == "nfs":
        nfs: NfsServer = request.getfixturevalue("nfs_server")
        return nfs.export / storage.url.rsplit("/", 1)[1]
    s3: S3Server = request.getfixturevalue("s3_server")
    return storage.url.removeprefix(f"s3://{s3.bucket}/")


def _remove_manifest(
    storage: Storage, migration_root: Path, request: pytest.FixtureRequest
) -> None:
    """The manifest beside the staged disk taken away: what an upstream export leaves."""
    where = _staged_path(storage, migration_root, request)
    if isinstance(where, Path):
        manifest = where.with_name(where.name + MANIFEST_SUFFIX)
        assert manifest.is_file(), f"the export wrote no manifest beside {where}"
        manifest.unlink()
        return
    s3: S3Server = request.getfixturevalue("s3_server")
    client = s3.client()
    client.head_object(Bucket=s3.bucket, Key=where + MANIFEST_SUFFIX)  # it was written
    client.delete_object(Bucket=s3.bucket, Key=where + MANIFEST_SUFFIX)


def _import(
    stub: pb_grpc.ProviderStub, storage: Storage, name: str, checksum: str
) -> pb.ImportDiskResponse:
    imported = stub.ImportDisk(
        pb.ImportDiskRequest(
            source_url=storage.url,
            format="qcow2",
            target_name=name,
            verify_checksum=True,
            expected_checksum=checksum,
            **storage.fields(),
        ),
        timeout=TRANSFER_SECONDS,
    )
    assert imported.checksum == checksum
    return imported


def _born_on_vsphere(
    vsphere: Replica,
    made: Made,
    variant: str,
    born: VirtualHardware,
    migration_root: Path,
    request: pytest.FixtureRequest,
) -> str:
    """The variant's guest as a VM on vSphere with the hardware it was born with: its disk
    staged with a manifest such as a vSphere export writes, imported, made into a VM."""
    storage = manager_storage("pvc", f"born-{variant}", request, migration_root)
    staged = _staged_path(storage, migration_root, request)
    staged.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(guest_image(variant), staged)
    checksum = hashlib.sha256(staged.read_bytes()).hexdigest()
    staged.with_name(staged.name + MANIFEST_SUFFIX).write_bytes(render(born, checksum))
    imported = _import(vsphere.stub, storage, f"{variant}-born", checksum)
    return made.create(
        vsphere.stub, f"{variant}-src", BIOS_CLASS, imported.path, networks_json=VSPHERE_NETWORK
    )


def _migrated(
    source: pb_grpc.ProviderStub,
    vm_id: str,
    target: pb_grpc.ProviderStub,
    storage: Storage,
    name: str,
    *,
    without_manifest: tuple[Path, pytest.FixtureRequest] | None = None,
) -> pb.ImportDiskResponse:
    """The manager's sequence for a running source: Power ON, a disk-only SnapshotCreate,
    ExportDisk at it, ImportDisk with its checksum, SnapshotDelete."""
    settled(source, source.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_ON), timeout=120).task)
    snapshot = source.SnapshotCreate(
        pb.SnapshotCreateRequest(vm_id=vm_id, name_hint=f"{name}-mig", include_memory=False),
        timeout=300,
    )
    settled(source, snapshot.task)
    exported = source.ExportDisk(
        pb.ExportDiskRequest(
            vm_id=vm_id,
            snapshot_id=snapshot.snapshot_id,
            destination_url=storage.url,
            format="qcow2",
            **storage.fields(),
        ),
        timeout=TRANSFER_SECONDS,
    )
    if without_manifest is not None:
        _remove_manifest(storage, *without_manifest)
    imported = _import(target, storage, name, exported.checksum)
    source.SnapshotDelete(
        pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=snapshot.snapshot_id), timeout=300
    )
    return imported


def _boots(kvm: Replica, conn: Any, vm_id: str) -> tuple[Any, Any]:
    """Power the VM on and read its console until its disk and network markers."""
    settled(
        kvm.stub, kvm.stub.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_ON), timeout=120).task
    )
    with console(conn, conn.lookupByUUIDString(vm_id)) as serial:
        serial.wait_for(READY, BOOT_SECONDS)
        return serial.wait_for(DISK, MARKER_SECONDS), serial.wait_for(NET, MARKER_SECONDS)


def _raw(stub: pb_grpc.ProviderStub, vm_id: str) -> dict[str, str]:
    described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=10)
    assert described.exists
    return dict(json.loads(described.provider_raw_json))


@pytest.mark.parametrize("variant", sorted(BORN_ON_VSPHERE))
def test_a_vsphere_born_guest_boots_on_libvirt_with_its_own_drivers(
    variant: str,
    provider: Replica,
    vsphere: Replica,
    conn: Any,
    made: Made,
    migration_root: Path,
    request: pytest.FixtureRequest,
) -> None:
    controller, nic, kind = BORN_ON_VSPHERE[variant]
    born = VirtualHardware(
        source_hypervisor="vsphere", disk_controller=controller, nic_models=(nic,)
    )
    source = _born_on_vsphere(vsphere, made, variant, born, migration_root, request)
    assert _raw(vsphere.stub, source)["disk_controller"] == controller.value

    storage = manager_storage(kind, f"travels-{variant}", request, migration_root)
    imported = _migrated(vsphere.stub, source, provider.stub, storage, f"{variant}-moved")
    target = made.create(provider.stub, f"{variant}-moved", BIOS_CLASS, imported.path)
    assert _raw(provider.stub, target)["disk_controller"] == controller.value
    disk, net = _boots(provider, conn, target)
    wanted = HARDWARE[variant]
    assert disk["driver"] == wanted.disk_driver, disk.group(0)
    assert net["driver"] == wanted.nic_driver, net.group(0)

    if variant == "pvscsi":  # the same guest on libvirt's own devices finds no disk
        again = _import(provider.stub, storage, "pvscsi-native", imported.checksum)
        native = made.create(provider.stub, "pvscsi-native", NATIVE_CLASS, again.path)
        assert _raw(provider.stub, native)["disk_controller"] == "virtio-blk"
        disk, net = _boots(provider, conn, native)
        assert disk.group(0) == "PYRIGAUD-DISK none"
        assert net.group(0) == "PYRIGAUD-NET none"


def test_a_uefi_only_guest_without_its_manifest_boots_by_uefi_on_libvirt(
    provider: Replica,
    vsphere: Replica,
    conn: Any,
    made: Made,
    migration_root: Path,
    request: pytest.FixtureRequest,
) -> None:
    born = VirtualHardware(source_hypervisor="vsphere", firmware=Firmware.UEFI)
    source = _born_on_vsphere(vsphere, made, "uefi", born, migration_root, request)
    storage = manager_storage("pvc", "travels-uefi", request, migration_root)
    imported = _migrated(
        vsphere.stub,
        source,
        provider.stub,
        storage,
        "uefi-moved",
        without_manifest=(migration_root, request),
    )
    target = made.create(provider.stub, "uefi-moved", BIOS_CLASS, imported.path)
    assert _raw(provider.stub, target)["firmware"] == "UEFI"
    disk, net = _boots(provider, conn, target)
    assert disk["driver"] == HARDWARE["uefi"].disk_driver, disk.group(0)
    assert net["driver"] == HARDWARE["uefi"].nic_driver, net.group(0)


def _libvirt_born(provider: Replica, made: Made, variant: str, class_json: str) -> str:
    """The variant's guest as a VM on libvirt with libvirt's own devices (virtio)."""
    prepared = provider.stub.ImagePrepare(
        pb.ImagePrepareRequest(
            image_json=json.dumps(
                {"source": {"libvirt": {"path": str(guest_image(variant)), "format": "qcow2"}}}
            ),
            target_name=f"{variant}-kvm-base",
        ),
        timeout=300,
    )
    return made.create(provider.stub, f"{variant}-kvm", class_json, prepared.prepared_image_path)


def _vsphere_firmware(vm_id: str) -> str:
    """The firmware of the simulator's VM of that instance UUID, read through pyVmomi."""
    session = shared_simulator().session()
    try:
        return str(
            session.call(
                lambda connection: (
                    connection.content.searchIndex.FindByUuid(
                        None, vm_id, True, True
                    ).config.firmware
                )
            )
        )
    finally:
        session.close()


def _fallbacks(vsphere: Replica, device: str) -> float:
    with urllib.request.urlopen(f"{vsphere.health_url}/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if (
                line.startswith("pyrigaud_hardware_fallbacks_total{")
                and f'device="{device}"' in line
            ):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_kvm_born_guest_gets_the_devices_chosen_for_it_on_vsphere(
    provider: Replica,
    vsphere: Replica,
    made: Made,
    migration_root: Path,
    request: pytest.FixtureRequest,
) -> None:
    source = _libvirt_born(provider, made, "virtio", BIOS_CLASS)
    before = _fallbacks(vsphere, "disk_controller")
    storage = manager_storage("s3", "travels-kvm", request, migration_root)
    imported = _migrated(provider.stub, source, vsphere.stub, storage, "kvm-moved")
    target = made.create(
        vsphere.stub, "kvm-moved", BIOS_CLASS, imported.path, networks_json=VSPHERE_NETWORK
    )
    raw = _raw(vsphere.stub, target)
    assert raw["disk_controller"] == "ide"
    assert raw["nic_models"] == "e1000e"
    assert _fallbacks(vsphere, "disk_controller") == before + 1
    assert _vsphere_firmware(target) == "bios"


@pytest.mark.parametrize("with_manifest", [True, False], ids=["manifest", "no-manifest"])
def test_a_uefi_guest_gets_uefi_on_vsphere(
    with_manifest: bool,
    provider: Replica,
    vsphere: Replica,
    made: Made,
    migration_root: Path,
    request: pytest.FixtureRequest,
) -> None:
    label = "with" if with_manifest else "without"
    source = _libvirt_born(provider, made, "uefi", UEFI_CLASS)
    storage = manager_storage("nfs", f"travels-uefi-{label}", request, migration_root)
    imported = _migrated(
        provider.stub,
        source,
        vsphere.stub,
        storage,
        f"uefi-{label}",
        without_manifest=None if with_manifest else (migration_root, request),
    )
    target = made.create(vsphere.stub, f"uefi-{label}", BIOS_CLASS, imported.path)
    assert _vsphere_firmware(target) == "efi"
