"""ExportDisk / ImportDisk on libvirt's test driver: every refusal, and what it leaves behind.

The test driver has no volume streams, so an export is refused honestly (and leaves nothing),
and imports that carry bytes use a writer into the pool directory's file (as in
test_image_prepare.py) up to the point where libvirt would convert them, which the test driver
does not do. The byte-for-byte round trips run on real QEMU (tests/integration/qemu).
"""

from __future__ import annotations

import hashlib
import os
import struct
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.adapters.hypervisors.libvirt.capabilities import LIBVIRT_CAPABILITIES
from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.storage import VolumeWriter, upload_volume
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import Capabilities, CreateRequest, OwnerMark, VMClass, VMImage
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

from support import ManualClock, error_of, ok
from support.libvirt import (
    add_base_image,
    create_vm,
    isolated_host_uri,
    libvirt_test_backend,
    write_pool_file,
)
from support.transfer import DiskMoves, disk_moves, export_disk, import_disk

OWNER = OwnerMark(provider="tests/libvirt-transfer")
CONTENT = bytes(range(256)) * 8192  # 2 MiB: more than one chunk


class _AsIfStreaming:
    """The capabilities of a libvirt host with volume streams."""

    def capabilities(self) -> Capabilities:
        return LIBVIRT_CAPABILITIES


@dataclass
class Host:
    backend: Backend
    connection: LibvirtConnection
    root: Path

    @property
    def moves(self) -> DiskMoves:
        """The transfers behind the gate a host with volume streams opens: the test driver's
        own capabilities claim none, so its adapter would never be reached."""
        return disk_moves(self.backend, self.root, capabilities=_AsIfStreaming())

    @property
    def mig(self) -> Path:
        return self.root / "mig"

    def volume_names(self) -> set[str]:
        def names(conn: object) -> set[str]:
            pool = conn.storagePoolLookupByName("default")  # type: ignore[attr-defined]
            return {str(volume.name()) for volume in pool.listAllVolumes(0)}

        return ok(self.connection.call(names))

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


def test_capabilities_do_not_claim_transfers_the_driver_cannot_stream(host: Host) -> None:
    caps = host.backend.capabilities.capabilities()

    assert not caps.supports_disk_export
    assert not caps.supports_disk_import
    assert caps.supported_export_formats == caps.supported_import_formats == ()
    assert caps.supports_snapshots  # what the driver does is still claimed


def test_an_export_without_volume_streams_is_refused_and_leaves_nothing(host: Host) -> None:
    vm_id = host.vm()
    before = host.volume_names()

    refused = export_disk(host.moves, vm_id, "pvc://mig/x")

    assert error_of(refused).kind is ErrorKind.UNSUPPORTED
    assert "cannot download" in error_of(refused).message
    assert os.listdir(host.mig) == []
    assert host.volume_names() == before


def test_an_import_without_volume_streams_is_refused_and_leaves_nothing(host: Host) -> None:
    (host.mig / "disk.raw").write_bytes(CONTENT)
    before = host.volume_names()

    refused = import_disk(host.moves, "pvc://mig/disk.raw", disk_format="raw")

    assert error_of(refused).kind is ErrorKind.UNSUPPORTED
    assert "cannot upload" in error_of(refused).message
    assert host.volume_names() == before


def test_a_missing_vm_or_disk_is_not_found(host: Host) -> None:
    vm_id = host.vm()
    port = host.moves

    assert error_of(export_disk(port, "no-such-vm", "pvc://mig/x")).kind is ErrorKind.NOT_FOUND
    missing_disk = export_disk(port, vm_id, "pvc://mig/x", disk_id="vdz")
    assert error_of(missing_disk).kind is ErrorKind.NOT_FOUND


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

    exported = export_disk(host.moves, vm_id, url)
    imported = import_disk(host.moves, url, disk_format="raw")

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

    imported = import_disk(host.moves, "pvc://mig/linked.raw")

    assert error_of(imported).kind is ErrorKind.INVALID_SPEC
    assert "source_url" in error_of(imported).message


def test_a_pvc_that_is_not_mounted_is_a_failed_precondition(host: Host) -> None:
    imported = import_disk(host.moves, "pvc://elsewhere/disk.qcow2")

    assert error_of(imported).kind is ErrorKind.FAILED_PRECONDITION
    assert "elsewhere" in error_of(imported).message


def test_what_libvirt_cannot_export_is_refused(host: Host) -> None:
    vm_id = host.vm()
    port = host.moves

    vmdk = export_disk(port, vm_id, "pvc://mig/x", disk_format="vmdk")
    snapshot = export_disk(port, vm_id, "pvc://mig/x", snapshot_id="before-upgrade")

    assert error_of(vmdk).kind is ErrorKind.UNSUPPORTED
    assert "vmdk" in error_of(vmdk).message
    assert error_of(snapshot).kind is ErrorKind.NOT_FOUND  # a snapshot the VM does not have
    assert "before-upgrade" in error_of(snapshot).message


def test_s3_credentials_and_options_are_checked_naming_the_wire_key(host: Host) -> None:
    port = host.moves
    options = {"bucket": "mig", "endpoint": "http://127.0.0.1:9", "usePathStyle": True}
    secret = {"secretAccessKey": "do-not-echo"}

    no_key = import_disk(port, "s3://mig/x.vmdk", backend="s3", options=options, credentials=secret)
    no_bucket = import_disk(
        port,
        "s3://mig/x.vmdk",
        backend="s3",
        options={"endpoint": "http://127.0.0.1:9"},
        credentials={**secret, "accessKeyID": "a"},
    )

    assert error_of(no_key).kind is ErrorKind.INVALID_SPEC
    assert "credentials.accessKeyID" in for_the_manager(error_of(no_key))
    assert error_of(no_bucket).kind is ErrorKind.INVALID_SPEC
    assert "storage_options_json.bucket" in for_the_manager(error_of(no_bucket))
    assert "do-not-echo" not in error_of(no_key).message + error_of(no_bucket).message


def test_unreachable_s3_storage_is_unavailable_and_leaves_nothing(host: Host) -> None:
    before = host.volume_names()
    options = {"bucket": "mig", "endpoint": "http://127.0.0.1:9", "usePathStyle": True}
    credentials = {"accessKeyID": "a", "secretAccessKey": "do-not-echo"}

    imported = import_disk(
        host.moves,
        "s3://mig/x.vmdk",
        backend="s3",
        options=options,
        credentials=credentials,
    )

    assert error_of(imported).kind is ErrorKind.UNAVAILABLE
    assert "do-not-echo" not in error_of(imported).message
    assert host.volume_names() == before


def test_a_wrong_checksum_leaves_nothing(writing_host: Host) -> None:
    host = writing_host
    (host.mig / "disk.raw").write_bytes(CONTENT)
    before = host.volume_names()

    wrong = import_disk(
        host.moves,
        "pvc://mig/disk.raw",
        disk_format="raw",
        expected_checksum="f" * 64,
    )

    assert error_of(wrong).kind is ErrorKind.FAILED_PRECONDITION
    assert "expected_checksum" in error_of(wrong).message
    assert hashlib.sha256(CONTENT).hexdigest() in error_of(wrong).message
    assert host.volume_names() == before


def test_an_image_that_would_open_other_files_is_refused(writing_host: Host) -> None:
    host = writing_host
    header = struct.pack(">4sIQ", b"QFI\xfb", 3, 512)  # a backing file name at offset 512
    (host.mig / "overlay.qcow2").write_bytes(header + CONTENT)
    data_file = bytearray(struct.pack(">4sIQ", b"QFI\xfb", 3, 0) + bytes(80))
    data_file[72:80] = struct.pack(">Q", 1 << 2)  # incompatible feature: external data file
    (host.mig / "data-file.qcow2").write_bytes(bytes(data_file) + CONTENT)
    descriptor = b'# Disk DescriptorFile\nRW 8 SPARSE "/etc/shadow"\n'
    (host.mig / "descriptor.vmdk").write_bytes(descriptor)
    before = host.volume_names()
    port = host.moves

    overlay = import_disk(port, "pvc://mig/overlay.qcow2", disk_format="raw")
    external = import_disk(port, "pvc://mig/data-file.qcow2")
    extents = import_disk(port, "pvc://mig/descriptor.vmdk", disk_format="vmdk")
    bad_digest = import_disk(port, "pvc://mig/overlay.qcow2", expected_checksum="md5:00")

    assert "backing file" in error_of(overlay).message
    assert "data" in error_of(external).message
    assert "extent" in error_of(extents).message
    assert "expected_checksum" in error_of(bad_digest).message
    for refused in (overlay, external, extents, bad_digest):
        assert error_of(refused).kind is ErrorKind.INVALID_SPEC
    assert host.volume_names() == before


def test_a_vm_with_passthrough_devices_is_refused_before_anything_is_staged(host: Host) -> None:
    vm_id = host.vm()

    def with_hostdev(conn: Any) -> None:
        root = ET.fromstring(conn.lookupByUUIDString(vm_id).XMLDesc(0))
        devices = root.find("devices")
        assert devices is not None
        hostdev = ET.SubElement(devices, "hostdev", {"mode": "subsystem", "type": "usb"})
        source = ET.SubElement(hostdev, "source")
        ET.SubElement(source, "vendor", {"id": "0x1234"})
        ET.SubElement(source, "product", {"id": "0xbeef"})
        conn.defineXML(ET.tostring(root, encoding="unicode"))

    ok(host.connection.call(with_hostdev))

    refused = export_disk(host.moves, vm_id, "pvc://mig/passthrough.qcow2")

    assert error_of(refused).kind is ErrorKind.FAILED_PRECONDITION
    assert "passthrough devices (usb)" in error_of(refused).message
    assert os.listdir(host.mig) == []
