"""Two dozen ImportDisk and ExportDisk calls into one vSphere datastore at once, over gRPC.

The vSphere counterpart of `tests/integration/qemu/test_concurrent_transfers.py`, on the
simulator and through a `pyrigaud serve` as the manager calls it: every valid kind of image is
imported while VMs' disks are exported from the same datastore, all two dozen calls started
together behind a barrier, so that imports' NFC leases, transient VMs and scratch conversions
overlap exports' leases and decoders. Each call must answer OK (never INTERNAL, never
UNIMPLEMENTED); each imported disk, exported again as raw, must hold what qemu-img reads from
its staged source, and each exported disk what its VM's disk holds, bytes compared. Once
staged on a PVC, once on S3 (moto), whose objects an import downloads and an export uploads.

The replica is given as many mutation slots as calls (`PYRIGAUD_MAX_CONCURRENT_OPS`), as an
operator migrating two dozen VMs at once would, so that all of them reach vCenter together
instead of queueing behind the default eight.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from pyrigaud.application.backend import Backend
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.at_once import all_at_once, holds
from support.disk_image import qemu_reading, sparse_disk
from support.image_corpus import VALID, oracle_raw, staged_valid_images
from support.migration import TRANSFER_SECONDS, Storage, manager_image_json, settled
from support.replica import Replica
from support.staging import S3Server, manager_s3_options, migration_name
from support.vsphere import SIMULATOR_DATASTORE, Simulator

PVC = "mig"
S3_PREFIX = "lab"
AT_ONCE = 24  # transfers started together, as a manager migrating two dozen VMs starts them
EXPORTS = AT_ONCE - len(VALID)  # VMs whose disks go out while the corpus comes in
EXPORT_FORMATS = ("vmdk", "qcow2", "raw")  # taken in turn, so every export path runs
BASE = sparse_disk(2 * 1024**2 + 4321, seed=41)  # what every exported VM's disk holds
CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256})


@dataclass(frozen=True)
class Staging:
    """A staging store: what the manager sends for an object on it (`storage_of` a name), and
    its objects put and got past the provider."""

    storage_of: Callable[[str], Storage]
    put: Callable[[str, bytes], None]
    get: Callable[[str], bytes]


def _pvc(root: Path) -> Staging:
    (root / PVC).mkdir(parents=True)

    def put(name: str, content: bytes) -> None:
        (root / PVC / name).write_bytes(content)

    return Staging(
        storage_of=lambda name: Storage("pvc", f"pvc://{PVC}/{name}"),
        put=put,
        get=lambda name: (root / PVC / name).read_bytes(),
    )


def _s3(server: S3Server, folder: str) -> Staging:
    options, credentials = manager_s3_options(server, prefix=S3_PREFIX)
    client = server.client()

    def key(name: str) -> str:
        return f"{S3_PREFIX}/{folder}/{name}"

    def put(name: str, content: bytes) -> None:
        client.put_object(Bucket=server.bucket, Key=key(name), Body=content)

    def get(name: str) -> bytes:
        body: bytes = client.get_object(Bucket=server.bucket, Key=key(name))["Body"].read()
        return body

    return Staging(
        storage_of=lambda name: Storage(
            "s3", f"s3://{server.bucket}/{key(name)}", options, credentials
        ),
        put=put,
        get=get,
    )


@dataclass
class Site:
    stub: pb_grpc.ProviderStub
    staging: Staging
    prefix: str  # of the names of the VMs and disks the test makes, one per staging store

    def import_disk(self, name: str, target_name: str, disk_format: str) -> str:
        """The object `name` imported as `target_name`; the landed disk's path."""
        storage = self.staging.storage_of(name)
        request = pb.ImportDiskRequest(
            source_url=storage.url, format=disk_format, target_name=target_name, **storage.fields()
        )
        response = self.stub.ImportDisk(request, timeout=TRANSFER_SECONDS)
        return str(response.path)

    def export_disk(self, vm_id: str, name: str, disk_format: str) -> None:
        storage = self.staging.storage_of(name)
        request = pb.ExportDiskRequest(
            vm_id=vm_id, destination_url=storage.url, format=disk_format, **storage.fields()
        )
        self.stub.ExportDisk(request, timeout=TRANSFER_SECONDS)

    def vm_around(self, name: str, disk_path: str) -> str:
        """A VM made by Create around an imported disk, as the manager makes the target VM."""
        created = self.stub.Create(
            pb.CreateRequest(
                name=name,
                class_json=CLASS_JSON,
                image_json=manager_image_json(disk_path, "vmdk"),
            ),
            timeout=60,
        )
        settled(self.stub, created.task)
        return str(created.id)


@pytest.fixture(params=["pvc", "s3"])
def site(
    request: pytest.FixtureRequest, simulator: Simulator, backend: Backend, tmp_path: Path
) -> Iterator[Site]:
    """A replica on the simulator staging on a PVC or S3; the conftest's `backend` deletes the
    VMs the test made."""
    root = tmp_path / "migration-storage"
    staging = (
        _pvc(root)
        if request.param == "pvc"
        else _s3(request.getfixturevalue("s3_server"), migration_name(request))
    )
    replica = Replica(
        simulator.serve_environ(
            PROVIDER_DEFAULT_DATASTORE=SIMULATOR_DATASTORE,
            PYRIGAUD_MIGRATION_STORAGE_ROOT=str(root),
            PYRIGAUD_MAX_CONCURRENT_OPS=str(AT_ONCE),
        ),
        tmp_path / "serve",
    )
    try:
        yield Site(replica.stub, staging, f"conc-{request.param}")
    finally:
        replica.stop()


def _answer(call: Callable[[], object]) -> grpc.StatusCode:
    """The status the call answered with (its details printed when not OK)."""
    try:
        call()
    except grpc.RpcError as error:
        print(f"{error.code()}: {error.details()}")
        return error.code()
    return grpc.StatusCode.OK


def _read_back(site: Site, vm_id: str, name: str, tmp_path: Path) -> bytes:
    """The VM's disk as an export staged as raw holds it."""
    site.export_disk(vm_id, f"{name}.raw", "raw")
    return _qemu_reading(site, f"{name}.raw", "raw", tmp_path)


def _qemu_reading(site: Site, name: str, disk_format: str, tmp_path: Path) -> bytes:
    """The staged object `name` as qemu-img reads it."""
    copy = tmp_path / name
    copy.write_bytes(site.staging.get(name))
    return qemu_reading(copy, disk_format, tmp_path / f"{name}.read.raw")


def test_two_dozen_imports_and_exports_into_one_datastore_at_once_move_the_right_bytes(
    site: Site, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    images = staged_valid_images(site.staging.put, corpus)
    site.staging.put("base.raw", BASE)
    sources = [
        site.vm_around(
            f"{site.prefix}-out-{index}",
            site.import_disk("base.raw", f"{site.prefix}-base-{index}", "raw"),
        )
        for index in range(EXPORTS)
    ]
    out_formats = [EXPORT_FORMATS[index % len(EXPORT_FORMATS)] for index in range(EXPORTS)]
    landed: dict[str, str] = {}

    def importing(name: str) -> Callable[[], grpc.StatusCode]:
        image = images[name]

        def call() -> None:
            landed[name] = site.import_disk(
                image.path.name, f"{site.prefix}-in-{name}", image.format
            )

        return lambda: _answer(call)

    def exporting(index: int) -> Callable[[], grpc.StatusCode]:
        name, disk_format = f"conc-out-{index}.{out_formats[index]}", out_formats[index]
        return lambda: _answer(lambda: site.export_disk(sources[index], name, disk_format))

    codes = all_at_once(
        [importing(name) for name in images] + [exporting(index) for index in range(EXPORTS)]
    )

    labels = [f"import {name}" for name in images] + [f"export {i}" for i in range(EXPORTS)]
    assert dict(zip(labels, codes, strict=True)) == dict.fromkeys(labels, grpc.StatusCode.OK)
    for name, path in landed.items():
        assert path.startswith(f"[{SIMULATOR_DATASTORE}] {site.prefix}-in-{name}/"), path
        vm_id = site.vm_around(f"{site.prefix}-in-{name}", path)
        disk = _read_back(site, vm_id, f"{site.prefix}-in-{name}.back", tmp_path)
        assert holds(disk, oracle_raw(images[name], corpus)), f"{name} landed other bytes"
    for index, disk_format in enumerate(out_formats):
        disk = _qemu_reading(site, f"conc-out-{index}.{disk_format}", disk_format, tmp_path)
        assert holds(disk, BASE), f"export {index} ({disk_format}) sent other bytes"
