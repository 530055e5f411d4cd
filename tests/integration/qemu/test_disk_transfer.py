"""ExportDisk / ImportDisk on real libvirtd + QEMU: volumes streamed to and from pvc:// files.

Everything lives in a pool of its own and a migration storage root of its own (0755, under
/var/lib/pyrigaud-test), both emptied before and after each test. The base image is a raw
volume of random bytes, so a round trip (export, import, Create from the import, export again
as raw) shows the guest's data came back, not just a file with the right checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    PoolSettings,
    upload_volume,
    volume_facts,
    volume_xml,
)
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CreateRequest,
    ExportRequest,
    ImportRequest,
    OwnerMark,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import PowerState
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from e2e_support import create_vm
from libvirt_support import libvirt_test_backend
from qemu_support import QEMU_URI, ensure_dir_pool, open_qemu, remove_pool_leftovers
from replica_support import Replica
from support import ManualClock, error_of, ok

POOL = "pyrigaud-transfer"
POOL_PATH = Path("/var/lib/pyrigaud-test/transfer")
STORAGE_PARENT = Path("/var/lib/pyrigaud-test")
BASE_BYTES = 4 * 1024**2
OWNER = OwnerMark(provider="tests/disk-transfer")
SMALL = VMClass(cpu=1, memory_mib=256)


@dataclass
class Site:
    backend: Backend
    conn: Any
    root: Path  # the migration storage root; the PVC "mig" is mounted at root/mig
    base: str  # a raw volume of random bytes
    content: bytes

    @property
    def mig(self) -> Path:
        return self.root / "mig"

    def volume_names(self) -> set[str]:
        pool = self.conn.storagePoolLookupByName(POOL)
        pool.refresh(0)
        return {str(volume.name()) for volume in pool.listAllVolumes(0)}


@pytest.fixture
def site() -> Iterator[Site]:
    conn = open_qemu()
    remove_pool_leftovers(conn, POOL, POOL_PATH)
    root = Path(tempfile.mkdtemp(prefix="migration-", dir=STORAGE_PARENT))
    root.chmod(0o755)
    (root / "mig").mkdir(mode=0o755)
    content = os.urandom(BASE_BYTES)
    pool = ensure_dir_pool(conn, POOL, POOL_PATH)
    base = pool.createXML(volume_xml("xfer-base.raw", BASE_BYTES, volume_format="raw"), 0)
    upload_volume(conn, base, [content])
    connection = LibvirtConnection(QEMU_URI)
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="qemu",
        pools=PoolSettings(default_pool=POOL, default_pool_path=str(POOL_PATH)),
        migration_storage_root=str(root),
    )
    try:
        yield Site(backend, conn, root, str(base.path()), content)
    finally:
        connection.close()
        remove_pool_leftovers(conn, POOL, POOL_PATH)
        shutil.rmtree(root)
        conn.close()


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _vm_from(site: Site, name: str, path: str, image_format: str) -> str:
    image = VMImage(path=path, format=image_format)
    request = CreateRequest(name=name, vm_class=SMALL, image=image)
    return ok(site.backend.lifecycle.start_create(request, OWNER)).id


def test_a_disk_goes_out_comes_back_and_boots_a_new_vm_with_its_data(site: Site) -> None:
    source = _vm_from(site, "xfer-source", site.base, "raw")
    before = site.volume_names()

    exported = ok(
        site.backend.disk_transfer.export_disk(
            ExportRequest(vm_id=source, destination_url="pvc://mig/x.qcow2")
        )
    )
    file = site.mig / "x.qcow2"
    assert exported.checksum == _sha256(file)
    assert exported.estimated_size_bytes == file.stat().st_size
    assert exported.export_id
    assert file.read_bytes()[:4] == b"QFI\xfb"
    assert sorted(os.listdir(site.mig)) == ["x.qcow2"], "a partial file was left behind"
    assert site.volume_names() == before, "the flattened copy made for the export was kept"

    imported = ok(
        site.backend.disk_transfer.import_disk(
            ImportRequest(
                source_url="pvc://mig/x.qcow2",
                target_name="xfer-restored",
                verify_checksum=True,
                expected_checksum=exported.checksum,
            )
        )
    )
    assert imported.checksum == exported.checksum
    assert imported.actual_size_bytes == file.stat().st_size
    assert imported.disk_id == "xfer-restored.qcow2"
    facts = volume_facts(site.conn, imported.path)
    assert facts is not None
    assert (facts.format, facts.capacity_bytes, facts.backing_path) == ("qcow2", BASE_BYTES, "")
    assert _sha256(Path(imported.path)) == exported.checksum, "the volume is not the file"

    copy = _vm_from(site, "xfer-copy", imported.path, "qcow2")
    raw = ok(
        site.backend.disk_transfer.export_disk(
            ExportRequest(vm_id=copy, destination_url="pvc://mig/deep/copy.raw", format="raw")
        )
    )
    assert (site.mig / "deep" / "copy.raw").read_bytes() == site.content
    assert raw.checksum == "sha256:" + hashlib.sha256(site.content).hexdigest()
    ok(
        site.backend.power.power_on(copy)
    )  # QEMU opens the imported volume as the disk's backing file
    assert ok(site.backend.power.power_state(copy)) is PowerState.ON


def test_an_import_retried_after_it_succeeded_answers_the_same_volume(site: Site) -> None:
    source = _vm_from(site, "xfer-retried", site.base, "raw")
    ok(
        site.backend.disk_transfer.export_disk(
            ExportRequest(vm_id=source, destination_url="pvc://mig/r.raw", format="raw")
        )
    )
    request = ImportRequest(source_url="pvc://mig/r.raw", target_name="xfer-again", format="raw")
    first = ok(site.backend.disk_transfer.import_disk(request))
    assert ok(site.backend.disk_transfer.import_disk(request)) == first  # its first answer was lost
    (site.mig / "other.raw").write_bytes(os.urandom(4096))
    clash = site.backend.disk_transfer.import_disk(
        ImportRequest(source_url="pvc://mig/other.raw", target_name="xfer-again", format="raw")
    )
    assert error_of(clash).kind is ErrorKind.ALREADY_EXISTS
    assert "other content" in error_of(clash).message


def test_a_wrong_checksum_imports_nothing(site: Site) -> None:
    source = _vm_from(site, "xfer-checked", site.base, "raw")
    ok(
        site.backend.disk_transfer.export_disk(
            ExportRequest(vm_id=source, destination_url="pvc://mig/c.qcow2")
        )
    )
    before = site.volume_names()

    wrong = site.backend.disk_transfer.import_disk(
        ImportRequest(
            source_url="pvc://mig/c.qcow2",
            target_name="xfer-wrong",
            verify_checksum=True,
            expected_checksum="sha256:" + "0" * 64,
        )
    )

    assert error_of(wrong).kind is ErrorKind.INVALID_SPEC
    assert "expected_checksum" in error_of(wrong).message
    assert site.volume_names() == before


def test_a_running_vm_is_refused_and_a_path_out_of_the_pvc_too(site: Site) -> None:
    source = _vm_from(site, "xfer-running", site.base, "raw")
    ok(site.backend.power.power_on(source))

    running = site.backend.disk_transfer.export_disk(
        ExportRequest(vm_id=source, destination_url="pvc://mig/r.qcow2")
    )
    escape = site.backend.disk_transfer.export_disk(
        ExportRequest(vm_id=source, destination_url="pvc://mig/../outside.qcow2")
    )

    assert error_of(running).kind is ErrorKind.FAILED_PRECONDITION
    assert "power it off" in error_of(running).message
    assert error_of(escape).kind is ErrorKind.INVALID_SPEC
    assert "destination_url" in error_of(escape).message
    assert os.listdir(site.mig) == []
    assert not (site.root / "outside.qcow2").exists()


def test_export_and_import_through_grpc(site: Site, tmp_path: Path) -> None:
    replica = Replica(
        {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": QEMU_URI,
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PROVIDER_DEFAULT_DATASTORE": POOL,
            "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(site.root),
        },
        tmp_path / "replica",
    )
    try:
        stub = replica.stub
        caps = stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=10)
        assert caps.supports_disk_export
        assert caps.supports_disk_import
        assert list(caps.supported_export_backends) == ["pvc"]
        assert list(caps.supported_transfer_modes) == ["relay"]
        image = json.dumps({"Path": site.base, "Format": "raw"})
        vm_id = create_vm(stub, "xfer-grpc", image_json=image)

        exported = stub.ExportDisk(
            pb.ExportDiskRequest(
                vm_id=vm_id,
                destination_url="pvc://mig/g.qcow2",
                format="qcow2",
                backend_type="pvc",
                transfer_mode="relay",  # what the manager sends for its "auto"
            ),
            timeout=120,
        )
        assert exported.checksum == _sha256(site.mig / "g.qcow2")

        imported = stub.ImportDisk(
            pb.ImportDiskRequest(
                source_url="pvc://mig/g.qcow2",
                format="qcow2",
                target_name="xfer-grpc-restored",
                backend_type="pvc",
                transfer_mode="relay",
                verify_checksum=True,
                expected_checksum=exported.checksum,
            ),
            timeout=120,
        )
        assert imported.checksum == exported.checksum
        landed = volume_facts(site.conn, imported.path)
        assert landed is not None
        assert landed.format == "qcow2"

        with pytest.raises(grpc.RpcError) as nfs:
            stub.ExportDisk(
                pb.ExportDiskRequest(
                    vm_id=vm_id, destination_url="nfs://server/share/x", backend_type="nfs"
                ),
                timeout=30,
            )
        assert nfs.value.code() is grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as escape:
            stub.ImportDisk(
                pb.ImportDiskRequest(source_url="pvc://mig/../../../etc/passwd", format="raw"),
                timeout=30,
            )
        assert escape.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "source_url" in (escape.value.details() or "")
    finally:
        assert replica.stop() == 0
