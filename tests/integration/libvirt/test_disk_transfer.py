"""ExportDisk / ImportDisk on libvirt's test driver: every refusal, and imports through a writer.

The test driver has no volume streams, so an export is refused honestly (and leaves nothing),
and imports that carry bytes use a writer into the pool directory's file (as in
test_image_prepare.py). The byte-for-byte round trip runs on real QEMU (tests/integration/qemu).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.storage import VolumeWriter, upload_volume
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CreateRequest,
    ExportRequest,
    ImportRequest,
    OwnerMark,
    TransferBackend,
    TransferMode,
    VMClass,
    VMImage,
)

from libvirt_support import (
    add_base_image,
    create_vm,
    isolated_host_uri,
    libvirt_test_backend,
    write_pool_file,
)
from support import ManualClock, error_of, ok

OWNER = OwnerMark(provider="tests/libvirt-transfer")
CONTENT = bytes(range(256)) * 8192  # 2 MiB: more than one chunk


@dataclass
class Host:
    backend: Backend
    connection: LibvirtConnection
    root: Path

    @property
    def mig(self) -> Path:
        return self.root / "mig"

    def volume_names(self) -> set[str]:
        def names(conn: object) -> set[str]:
            pool = conn.storagePoolLookupByName("default")  # type: ignore[attr-defined]
            return {str(volume.name()) for volume in pool.listAllVolumes(0)}

        return self.connection.call(names)

    def vm(self) -> str:
        image = VMImage(path=add_base_image(self.connection), format="qcow2")
        request = CreateRequest(name="moving", vm_class=VMClass(cpu=1, memory_mib=256), image=image)
        return ok(create_vm(self.backend, request, OWNER))


def _host(tmp_path: Path, writer: VolumeWriter) -> Iterator[Host]:
    root = tmp_path / "migration"
    (root / "mig").mkdir(parents=True)
    connection = LibvirtConnection(isolated_host_uri(tmp_path))
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="test",
        volume_writer=writer,
        migration_storage_root=str(root),
    )
    try:
        yield Host(backend, connection, root)
    finally:
        connection.close()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    """The backend with libvirt's own stream upload, which the test driver refuses."""
    yield from _host(tmp_path, upload_volume)


@pytest.fixture
def writing_host(tmp_path: Path) -> Iterator[Host]:
    """The backend writing imported bytes straight into the pool's files."""
    yield from _host(tmp_path, write_pool_file)


def test_capabilities_tell_what_moves_and_how(host: Host) -> None:
    caps = host.backend.capabilities.capabilities()

    assert caps.supports_disk_export
    assert caps.supports_disk_import
    assert caps.supported_export_formats == caps.supported_import_formats == ("qcow2", "raw")
    assert caps.supported_export_backends == caps.supported_import_backends == ("pvc",)
    assert caps.supported_transfer_modes == ("relay",)
    assert not caps.supports_export_compression


def test_an_export_without_volume_streams_is_refused_and_leaves_nothing(host: Host) -> None:
    vm_id = host.vm()
    before = host.volume_names()

    refused = host.backend.disk_transfer.export_disk(
        ExportRequest(vm_id=vm_id, destination_url="pvc://mig/x")
    )

    assert error_of(refused).kind is ErrorKind.UNSUPPORTED
    assert "cannot download" in error_of(refused).message
    assert os.listdir(host.mig) == []
    assert host.volume_names() == before


def test_an_import_without_volume_streams_is_refused_and_leaves_nothing(host: Host) -> None:
    (host.mig / "disk.raw").write_bytes(CONTENT)
    before = host.volume_names()

    refused = host.backend.disk_transfer.import_disk(
        ImportRequest(source_url="pvc://mig/disk.raw", format="raw")
    )

    assert error_of(refused).kind is ErrorKind.UNSUPPORTED
    assert "cannot upload" in error_of(refused).message
    assert host.volume_names() == before


def test_a_missing_vm_or_disk_is_not_found(host: Host) -> None:
    vm_id = host.vm()
    missing_vm = ExportRequest(vm_id="no-such-vm", destination_url="pvc://mig/x")
    missing_disk = ExportRequest(vm_id=vm_id, disk_id="vdz", destination_url="pvc://mig/x")

    assert error_of(host.backend.disk_transfer.export_disk(missing_vm)).kind is ErrorKind.NOT_FOUND
    assert (
        error_of(host.backend.disk_transfer.export_disk(missing_disk)).kind is ErrorKind.NOT_FOUND
    )


@pytest.mark.parametrize(
    "url",
    [
        "pvc://mig/../escaped",
        "pvc://mig/a/../../escaped",
        "pvc:///etc/passwd",
        "pvc://mig//etc/passwd",
        "pvc://mig/",
        "pvc://mig/a/./b",
        "pvc://Mig/x",
        "pvc://user:secret@mig/x",
        "pvc://mig/x?y=1",
        "pvc://mig/outside/x",  # through a symbolic link out of the PVC
    ],
)
def test_a_path_that_leaves_its_pvc_is_an_invalid_spec(host: Host, url: str) -> None:
    (host.mig / "outside").symlink_to(host.root.parent)
    vm_id = host.vm()

    exported = host.backend.disk_transfer.export_disk(
        ExportRequest(vm_id=vm_id, destination_url=url)
    )
    imported = host.backend.disk_transfer.import_disk(ImportRequest(source_url=url, format="raw"))

    assert error_of(exported).kind is ErrorKind.INVALID_SPEC
    assert "destination_url" in error_of(exported).message
    assert error_of(imported).kind is ErrorKind.INVALID_SPEC
    assert "source_url" in error_of(imported).message
    assert "secret" not in error_of(exported).message + error_of(imported).message
    assert sorted(os.listdir(host.root.parent)) == ["migration", "node.xml", "pool"]


def test_a_file_linked_from_outside_is_refused(host: Host) -> None:
    outside = host.root.parent / "secret.raw"
    outside.write_bytes(CONTENT)
    (host.mig / "linked.raw").symlink_to(outside)

    imported = host.backend.disk_transfer.import_disk(
        ImportRequest(source_url="pvc://mig/linked.raw")
    )

    assert error_of(imported).kind is ErrorKind.INVALID_SPEC
    assert "source_url" in error_of(imported).message


def test_a_pvc_that_is_not_mounted_is_a_failed_precondition(host: Host) -> None:
    imported = host.backend.disk_transfer.import_disk(
        ImportRequest(source_url="pvc://elsewhere/disk.qcow2")
    )

    assert error_of(imported).kind is ErrorKind.FAILED_PRECONDITION
    assert "elsewhere" in error_of(imported).message


@pytest.mark.parametrize(
    "changes",
    [
        {"backend": TransferBackend.NFS},
        {"backend": TransferBackend.S3},
        {"mode": TransferMode.DIRECT},
        {"format": "vmdk"},
        {"compress": True},
        {"snapshot_id": "before-upgrade"},
    ],
)
def test_what_libvirt_cannot_transfer_is_unsupported(
    host: Host, changes: dict[str, object]
) -> None:
    vm_id = host.vm()
    request = ExportRequest(vm_id=vm_id, destination_url="pvc://mig/x").model_copy(update=changes)

    assert error_of(host.backend.disk_transfer.export_disk(request)).kind is ErrorKind.UNSUPPORTED
    if "compress" not in changes and "snapshot_id" not in changes:
        importing = ImportRequest(source_url="pvc://mig/x").model_copy(update=changes)
        assert (
            error_of(host.backend.disk_transfer.import_disk(importing)).kind
            is ErrorKind.UNSUPPORTED
        )


def test_a_raw_import_lands_checked_and_a_wrong_checksum_leaves_nothing(
    writing_host: Host,
) -> None:
    host = writing_host
    (host.mig / "disk.raw").write_bytes(CONTENT)
    digest = "sha256:" + hashlib.sha256(CONTENT).hexdigest()
    before = host.volume_names()

    wrong = host.backend.disk_transfer.import_disk(
        ImportRequest(
            source_url="pvc://mig/disk.raw",
            format="raw",
            verify_checksum=True,
            expected_checksum="sha256:" + "f" * 64,
        )
    )
    assert error_of(wrong).kind is ErrorKind.INVALID_SPEC
    assert "expected_checksum" in error_of(wrong).message
    assert host.volume_names() == before

    imported = ok(
        host.backend.disk_transfer.import_disk(
            ImportRequest(
                source_url="pvc://mig/disk.raw",
                format="raw",
                verify_checksum=True,
                expected_checksum=digest.upper().replace("SHA256:", ""),
            )
        )
    )
    assert (imported.disk_id, imported.checksum) == ("disk.raw", digest)
    assert imported.actual_size_bytes == len(CONTENT)
    assert Path(imported.path).read_bytes() == CONTENT
    assert host.volume_names() == before | {"disk.raw"}

    again = host.backend.disk_transfer.import_disk(
        ImportRequest(source_url="pvc://mig/disk.raw", format="raw")
    )
    assert error_of(again).kind is ErrorKind.ALREADY_EXISTS


def test_an_image_that_is_not_what_it_claims_is_refused(writing_host: Host) -> None:
    host = writing_host
    (host.mig / "plain.qcow2").write_bytes(CONTENT)
    header = struct.pack(">4sIQ", b"QFI\xfb", 3, 512)  # a backing file name at offset 512
    (host.mig / "overlay.qcow2").write_bytes(header + CONTENT)

    plain = host.backend.disk_transfer.import_disk(
        ImportRequest(source_url="pvc://mig/plain.qcow2")
    )
    overlay = host.backend.disk_transfer.import_disk(
        ImportRequest(source_url="pvc://mig/overlay.qcow2")
    )
    disguised = host.backend.disk_transfer.import_disk(
        ImportRequest(source_url="pvc://mig/overlay.qcow2", target_name="disguised", format="raw")
    )
    bad_digest = host.backend.disk_transfer.import_disk(
        ImportRequest(
            source_url="pvc://mig/plain.qcow2", verify_checksum=True, expected_checksum="md5:00"
        )
    )

    assert "format" in error_of(plain).message
    assert "backing file" in error_of(overlay).message
    assert "format" in error_of(disguised).message
    assert "expected_checksum" in error_of(bad_digest).message
    for refused in (plain, overlay, disguised, bad_digest):
        assert error_of(refused).kind is ErrorKind.INVALID_SPEC
