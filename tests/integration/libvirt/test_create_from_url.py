"""Create from an image URL on the test driver: what it can show without volume uploads.

The test driver cannot upload into a volume, so a URL Create there answers UNSUPPORTED and
leaves nothing; a spec that cannot work is refused before any domain or traffic. The
download itself is proven on real QEMU (tests/integration/qemu/test_create_from_url.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import CreateRequest, DiskQuery, OwnerMark, VMClass, VMImage

from support import ManualClock, error_of, ok, present
from support.image_server import ImageServer, raw_image, serving
from support.libvirt import add_base_image, create_vm, isolated_host_uri, make_backend

OWNER = OwnerMark(provider="tests/libvirt-url")

Host = tuple[Backend, LibvirtConnection]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    backend, connection = make_backend(
        isolated_host_uri(tmp_path), ManualClock(), allow_loopback_urls=True
    )
    yield backend, connection
    connection.close()


@pytest.fixture
def images() -> Iterator[ImageServer]:
    with serving({"/disk.raw": raw_image(64 * 1024)}) as server:
        yield server


def request(image: VMImage) -> CreateRequest:
    return CreateRequest(name="from-url", vm_class=VMClass(cpu=1, memory_mib=256), image=image)


def assert_nothing_left(connection: LibvirtConnection) -> None:
    def listing(conn: Any) -> tuple[list[str], list[str]]:
        return conn.listDefinedDomains(), conn.storagePoolLookupByName("default").listVolumes()

    assert ok(connection.call(listing)) == ([], [])


def test_a_url_create_is_unsupported_where_volumes_cannot_be_uploaded(
    host: Host, images: ImageServer
) -> None:
    backend, connection = host
    error = error_of(create_vm(backend, request(VMImage(url=images.url("/disk.raw"))), OWNER))
    assert error.kind is ErrorKind.UNSUPPORTED
    assert "virStorageVolUpload" in error.message
    assert_nothing_left(connection)


@pytest.mark.parametrize(
    ("image", "field"),
    [
        (VMImage(url="http://169.254.169.254/latest/meta-data/"), "image.url"),
        (VMImage(url="file:///etc/passwd"), "image.url"),
        (
            VMImage(url="{base}/disk.raw", checksum="ab", checksum_type="crc32"),
            "image.checksum_type",
        ),
        (VMImage(url="{base}/disk.raw", format="vmdk"), "image.format"),
    ],
)
def test_a_url_spec_that_cannot_work_is_refused_before_any_traffic(
    host: Host, images: ImageServer, image: VMImage, field: str
) -> None:
    backend, connection = host
    image = image.model_copy(update={"url": image.url.format(base=images.base)})
    error = error_of(create_vm(backend, request(image), OWNER))
    assert (error.kind, error.message.split(":")[0]) == (ErrorKind.INVALID_SPEC, field)
    assert images.requests == []
    assert_nothing_left(connection)


def test_a_path_wins_over_a_url_and_is_overlaid_not_downloaded(
    host: Host, images: ImageServer
) -> None:
    backend, connection = host
    base = add_base_image(connection)
    image = VMImage(path=base, url=images.url("/disk.raw"))
    vm_id = ok(create_vm(backend, request(image), OWNER))
    assert (
        ok(present(backend.disk_transfer).disk_details(DiskQuery(vm_id=vm_id))).backing_file == base
    )
    assert images.requests == []


def test_an_image_the_server_does_not_give_is_unavailable_and_leaves_nothing(
    host: Host, images: ImageServer
) -> None:
    backend, connection = host
    error = error_of(create_vm(backend, request(VMImage(url=images.url("/missing.qcow2"))), OWNER))
    assert error.kind is ErrorKind.UNAVAILABLE
    assert "404" in error.message
    assert images.requests == ["/missing.qcow2"]
    assert_nothing_left(connection)
