"""Create from an image URL on real libvirtd: the image lands in the VM's own root volume.

A loopback HTTP server (allowed through the backend's `allow_loopback_urls`) serves images
made with qemu-img; what the backend made is read back with libvirt and qemu-img. The tests
use a pool of their own, emptied before and after each.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
from returns.result import Result

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import (
    CreateRequest,
    DiskDefaults,
    DiskQuery,
    OwnerMark,
    VMClass,
    VMImage,
)
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support import ManualClock, error_of, ok
from support.image_server import ImageServer, qcow2_backed_by, qcow2_of, raw_image, serving
from support.libvirt import create_vm, libvirt_test_backend
from support.qemu import QEMU_URI, open_qemu, qemu_img_info, remove_pool_leftovers
from support.replica import Replica

OWNER = OwnerMark(provider="tests/qemu-url")
GIB = 1024**3
RAW = raw_image(8 * 1024**2)
URL_POOL = "pyrigaud-url"  # this module's own: other suites' cleanups never race it
URL_POOL_PATH = Path("/var/lib/pyrigaud-test/url")


@pytest.fixture
def conn() -> Iterator[Any]:
    """A raw connection; the module's own pool, emptied before and after each test."""
    connection = open_qemu()
    remove_pool_leftovers(connection, URL_POOL, URL_POOL_PATH)
    yield connection
    remove_pool_leftovers(connection, URL_POOL, URL_POOL_PATH)
    connection.close()


def url_backend(*, allow_loopback_urls: bool) -> tuple[Backend, LibvirtConnection]:
    connection = LibvirtConnection(QEMU_URI)
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="qemu",
        pools=PoolSettings(default_pool=URL_POOL, default_pool_path=str(URL_POOL_PATH)),
        allow_loopback_urls=allow_loopback_urls,
    )
    return backend, connection


@pytest.fixture
def backend(conn: Any) -> Iterator[Backend]:
    """The backend on the module's pool, loopback URLs allowed (the server is on 127.0.0.1)."""
    backend, connection = url_backend(allow_loopback_urls=True)
    yield backend
    connection.close()


@pytest.fixture
def images(tmp_path: Path) -> Iterator[ImageServer]:
    backing = tmp_path / "host-secret.raw"
    backing.write_bytes(b"a file of the host" * 100)
    with serving(
        {
            "/disk.qcow2": qcow2_of(RAW, tmp_path),
            "/disk.raw": RAW,
            "/backed.qcow2": qcow2_backed_by(backing, tmp_path),
            "/empty.raw": b"",
        }
    ) as server:
        yield server


def request(name: str, image: VMImage, size_gib: int = 1) -> CreateRequest:
    vm_class = VMClass(cpu=1, memory_mib=256, disk_defaults=DiskDefaults(size_gib=size_gib))
    return CreateRequest(name=name, vm_class=vm_class, image=image)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def own_files() -> set[str]:
    return set(os.listdir(URL_POOL_PATH))


def same_content(raw: bytes, path: str, tmp_path: Path) -> bool:
    """qemu-img compare: equal up to the raw image's end, zeros past it."""
    source = tmp_path / "expected.raw"
    source.write_bytes(raw)
    compared = subprocess.run(
        ["qemu-img", "compare", "-U", "-f", "raw", "-F", "qcow2", str(source), path],
        check=False,
        capture_output=True,
    )
    return compared.returncode == 0


@pytest.mark.parametrize("path", ["/disk.qcow2", "/disk.raw"])
def test_a_url_image_becomes_the_vms_own_grown_qcow2_root_and_delete_removes_it(
    backend: Backend, images: ImageServer, conn: Any, tmp_path: Path, path: str
) -> None:
    body = images.images[path]
    image = VMImage(url=images.url(path), checksum=sha256(body))
    vm_id = ok(create_vm(backend, request("url-vm", image, size_gib=1), OWNER))

    disk = ok(backend.disk_transfer.disk_details(DiskQuery(vm_id=vm_id)))
    sources = ET.fromstring(conn.lookupByUUIDString(vm_id).XMLDesc(0)).iterfind(
        "devices/disk[@device='disk']/source"
    )
    assert [source.get("file") for source in sources] == [disk.path]
    assert Path(disk.path).parent == URL_POOL_PATH
    assert (disk.format, disk.backing_file, disk.virtual_size_bytes) == ("qcow2", "", GIB)
    info = qemu_img_info(disk.path)
    assert info["format"] == "qcow2"
    assert "backing-filename" not in info  # the VM's own file, no chain to anything shared
    assert same_content(RAW, disk.path, tmp_path)
    assert own_files() == {Path(disk.path).name}  # a raw image's scratch volume is gone
    assert images.requests == [path]
    ok(backend.power.power_on(vm_id))  # QEMU opens the root as the qcow2 the domain says it is
    assert conn.lookupByUUIDString(vm_id).state()[0] == libvirt.VIR_DOMAIN_RUNNING

    ok(backend.lifecycle.delete(vm_id))
    assert own_files() == set()


def test_the_building_vm_records_the_volumes_of_a_download_in_flight(
    backend: Backend, images: ImageServer, conn: Any
) -> None:
    """What a provider killed mid-download leaves is named by its building VM, for the sweep."""
    images.held.set()
    created: list[Result[str, ProviderError]] = []
    image = VMImage(url=images.url("/disk.raw"))
    creating = threading.Thread(
        target=lambda: created.append(create_vm(backend, request("url-held", image), OWNER))
    )
    creating.start()
    try:
        assert images.arrived.wait(60), "the Create never asked for the image"
        building = Guest(conn.lookupByName("url-held")).metadata()
        assert building is not None
        assert building.building
        planned = [Path(path) for path in building.volumes]
        assert {path.parent for path in planned} == {URL_POOL_PATH}
        assert sorted("-download-" in path.name for path in planned) == [False, True]
    finally:
        images.release.set()
        creating.join(120)
    vm_id = ok(created[0])
    finished = Guest(conn.lookupByUUIDString(vm_id)).metadata()
    assert finished is not None
    assert not finished.building
    assert finished.volumes == (
        ok(backend.disk_transfer.disk_details(DiskQuery(vm_id=vm_id))).path,
    )


def test_an_image_larger_than_the_class_disk_keeps_its_size(
    backend: Backend, images: ImageServer
) -> None:
    vm_id = ok(
        create_vm(backend, request("url-vm", VMImage(url=images.url("/disk.qcow2")), 0), OWNER)
    )
    assert ok(backend.disk_transfer.disk_details(DiskQuery(vm_id=vm_id))).virtual_size_bytes == len(
        RAW
    )


def test_a_wrong_checksum_is_an_invalid_spec_and_leaves_nothing(
    backend: Backend, images: ImageServer, conn: Any
) -> None:
    image = VMImage(url=images.url("/disk.raw"), checksum=sha256(b"another image"))
    error = error_of(create_vm(backend, request("url-bad-sum", image), OWNER))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("image.checksum:")
    assert images.requests == ["/disk.raw"]
    assert_nothing_left(conn, "url-bad-sum")


@pytest.mark.parametrize(
    ("path", "image_format", "field", "reason"),
    [
        ("/backed.qcow2", "", "image.url", "backing file"),
        ("/empty.raw", "", "image.url", "empty"),
        ("/disk.qcow2", "raw", "image.format", "qcow2, not raw"),
    ],
)
def test_an_image_that_cannot_be_a_disk_is_refused_before_anything_is_stored(
    backend: Backend,
    images: ImageServer,
    conn: Any,
    path: str,
    image_format: str,
    field: str,
    reason: str,
) -> None:
    image = VMImage(url=images.url(path), format=image_format)
    error = error_of(create_vm(backend, request("url-unusable", image), OWNER))
    assert (error.kind, error.message.split(":")[0]) == (ErrorKind.INVALID_SPEC, field)
    assert reason in error.message
    assert_nothing_left(conn, "url-unusable")


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/disk.qcow2", "http://[fe80::1]/disk.raw"]
)
def test_link_local_and_metadata_urls_are_refused_before_any_traffic_or_domain(
    backend: Backend, conn: Any, url: str
) -> None:
    error = error_of(create_vm(backend, request("url-metadata", VMImage(url=url)), OWNER))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("image.url:")
    assert_nothing_left(conn, "url-metadata")


def test_loopback_is_refused_unless_the_operator_allows_it(images: ImageServer, conn: Any) -> None:
    backend, connection = url_backend(allow_loopback_urls=False)
    try:
        image = VMImage(url=images.url("/disk.raw"))
        error = error_of(create_vm(backend, request("url-loop", image), OWNER))
    finally:
        connection.close()
    assert error.kind is ErrorKind.INVALID_SPEC
    assert "loopback" in error.message
    assert images.requests == []
    assert_nothing_left(conn, "url-loop")


def test_create_over_grpc_downloads_the_url_image(
    images: ImageServer, conn: Any, tmp_path: Path
) -> None:
    replica = Replica(
        {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": QEMU_URI,
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PROVIDER_DEFAULT_DATASTORE": URL_POOL,
            "PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK": "true",
        },
        tmp_path / "replica",
    )
    try:
        image = {"URL": images.url("/disk.qcow2"), "Checksum": sha256(images.images["/disk.qcow2"])}
        created = replica.stub.Create(
            pb.CreateRequest(
                name="url-grpc",
                class_json=json.dumps({"CPU": 1, "MemoryMiB": 256, "DiskDefaults": {"SizeGiB": 2}}),
                image_json=json.dumps(image),
            ),
            timeout=120,
        )
        dom = conn.lookupByUUIDString(created.id)
        (path,) = (
            source.get("file", "")
            for source in ET.fromstring(dom.XMLDesc(0)).iterfind(
                "devices/disk[@device='disk']/source"
            )
        )
        assert conn.storageVolLookupByPath(path).info()[1] == 2 * GIB
        assert same_content(RAW, path, tmp_path)
        replica.stub.Delete(pb.DeleteRequest(id=created.id), timeout=60)
        assert own_files() == set()
    finally:
        replica.stop()


def assert_nothing_left(conn: Any, name: str) -> None:
    with pytest.raises(libvirt.libvirtError):
        conn.lookupByName(name)
    assert own_files() == set()
