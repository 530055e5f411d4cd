"""Two dozen ImportDisk and ExportDisk calls into one vSphere datastore at once, over gRPC.

The vSphere counterpart of `tests/integration/qemu/test_concurrent_transfers.py`, on the
simulator and through a `pyrigaud serve` as the manager calls it: every valid kind of image is
imported while VMs' disks are exported from the same datastore, all two dozen calls started
together behind a barrier, so that imports' NFC leases, transient VMs and scratch conversions
overlap exports' leases and decoders. Each call must answer OK (never INTERNAL, never
UNIMPLEMENTED); each imported disk, exported again as raw, must hold what qemu-img reads from
its staged source, and each exported disk what its VM's disk holds, bytes compared.

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
from support.image_corpus import VALID, CorpusImage, oracle_raw, valid_image
from support.migration import TRANSFER_SECONDS, manager_image_json, settled
from support.replica import Replica
from support.vsphere import SIMULATOR_DATASTORE, Simulator

PVC = "mig"
AT_ONCE = 24  # transfers started together, as a manager migrating two dozen VMs starts them
EXPORTS = AT_ONCE - len(VALID)  # VMs whose disks go out while the corpus comes in
EXPORT_FORMATS = ("vmdk", "qcow2", "raw")  # taken in turn, so every export path runs
BASE = sparse_disk(2 * 1024**2 + 4321, seed=41)  # what every exported VM's disk holds
CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256})


@dataclass
class Site:
    stub: pb_grpc.ProviderStub
    staging: Path  # the replica's PYRIGAUD_MIGRATION_STORAGE_ROOT

    def stage(self, name: str, content: bytes) -> str:
        """`content` staged on the PVC as `name`; its pvc:// URL."""
        (self.staging / PVC / name).write_bytes(content)
        return f"pvc://{PVC}/{name}"

    def path_of(self, name: str) -> Path:
        """Where the object `name` of the PVC is, read past the provider."""
        return self.staging / PVC / name

    def import_disk(self, url: str, target_name: str, disk_format: str) -> pb.ImportDiskResponse:
        request = pb.ImportDiskRequest(
            source_url=url,
            format=disk_format,
            target_name=target_name,
            backend_type="pvc",
            transfer_mode="relay",
        )
        response: pb.ImportDiskResponse = self.stub.ImportDisk(request, timeout=TRANSFER_SECONDS)
        return response

    def export_disk(self, vm_id: str, url: str, disk_format: str) -> pb.ExportDiskResponse:
        request = pb.ExportDiskRequest(
            vm_id=vm_id,
            destination_url=url,
            format=disk_format,
            backend_type="pvc",
            transfer_mode="relay",
        )
        response: pb.ExportDiskResponse = self.stub.ExportDisk(request, timeout=TRANSFER_SECONDS)
        return response

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


@pytest.fixture
def site(simulator: Simulator, backend: Backend, tmp_path: Path) -> Iterator[Site]:
    """A replica on the simulator staging on a PVC; the conftest's `backend` deletes the VMs
    the test made."""
    staging = tmp_path / "migration-storage"
    (staging / PVC).mkdir(parents=True)
    replica = Replica(
        simulator.serve_environ(
            PROVIDER_DEFAULT_DATASTORE=SIMULATOR_DATASTORE,
            PYRIGAUD_MIGRATION_STORAGE_ROOT=str(staging),
            PYRIGAUD_MAX_CONCURRENT_OPS=str(AT_ONCE),
        ),
        tmp_path / "serve",
    )
    try:
        yield Site(replica.stub, staging)
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
    site.export_disk(vm_id, f"pvc://{PVC}/{name}.raw", "raw")
    return qemu_reading(site.path_of(f"{name}.raw"), "raw", tmp_path / f"{name}.read.raw")


def test_two_dozen_imports_and_exports_into_one_datastore_at_once_move_the_right_bytes(
    site: Site, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    images: dict[str, CorpusImage] = {name: valid_image(name, corpus) for name in sorted(VALID)}
    urls = {
        name: site.stage(image.path.name, image.path.read_bytes()) for name, image in images.items()
    }
    base_url = site.stage("base.raw", BASE)
    sources = [
        site.vm_around(
            f"conc-out-{index}", site.import_disk(base_url, f"conc-base-{index}", "raw").path
        )
        for index in range(EXPORTS)
    ]
    out_formats = [EXPORT_FORMATS[index % len(EXPORT_FORMATS)] for index in range(EXPORTS)]
    landed: dict[str, str] = {}

    def importing(name: str) -> Callable[[], object]:
        def call() -> None:
            landed[name] = site.import_disk(urls[name], f"conc-in-{name}", images[name].format).path

        return lambda: _answer(call)

    def exporting(index: int) -> Callable[[], object]:
        url = f"pvc://{PVC}/conc-out-{index}.{out_formats[index]}"
        return lambda: _answer(lambda: site.export_disk(sources[index], url, out_formats[index]))

    codes = all_at_once(
        [importing(name) for name in images] + [exporting(index) for index in range(EXPORTS)]
    )

    labels = [f"import {name}" for name in images] + [f"export {i}" for i in range(EXPORTS)]
    assert dict(zip(labels, codes, strict=True)) == dict.fromkeys(labels, grpc.StatusCode.OK)
    for name, path in landed.items():
        assert path.startswith(f"[{SIMULATOR_DATASTORE}] conc-in-{name}/"), path
        vm_id = site.vm_around(f"conc-in-{name}", path)
        disk = _read_back(site, vm_id, f"conc-in-{name}.back", tmp_path)
        assert holds(disk, oracle_raw(images[name], corpus)), f"{name} landed other bytes"
    for index, disk_format in enumerate(out_formats):
        staged = site.path_of(f"conc-out-{index}.{disk_format}")
        disk = qemu_reading(staged, disk_format, tmp_path / f"conc-out-{index}.read.raw")
        assert holds(disk, BASE), f"export {index} ({disk_format}) sent other bytes"
