"""ImagePrepare on the test driver: from a pool volume, a host file, and a loopback http server.

The test driver cannot upload volumes, so imports that carry bytes use a writer into the pool
directory's file (see support.libvirt.write_pool_file); the real stream's refusal is shown too.
URLs use IP literals and /etc/hosts names only: no test resolves a real DNS name.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pyrigaud.adapters.downloads import DownloadFields, open_download
from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CreateRequest,
    DiskQuery,
    ImageSource,
    OwnerMark,
    PrepareImageRequest,
    VMClass,
    VMImage,
)

from support import ManualClock, error_of, ok, present
from support.disk_image import qemu_img
from support.libvirt import (
    add_base_image,
    create_vm,
    isolated_host_uri,
    make_backend,
    write_pool_file,
)

OWNER = OwnerMark(provider="tests/libvirt-images")


def made_images() -> tuple[bytes, bytes]:
    """Images qemu-img makes: a standalone qcow2 of a little over 1 MiB (more than one
    chunk), and one naming a host file as its backing file (a VM on it would read that file)."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "data.raw").write_bytes(bytes(range(256)) * 8192)
        qemu_img("convert", "-O", "qcow2", folder / "data.raw", folder / "image.qcow2")
        qemu_img(
            "create", "-f", "qcow2", "-u", "-b", "/etc/shadow", "-F", "raw",
            folder / "backed.qcow2", "1M",
        )  # fmt: skip
        return (folder / "image.qcow2").read_bytes(), (folder / "backed.qcow2").read_bytes()


IMAGE, BACKED_IMAGE = made_images()
RAW_IMAGE = bytes(range(256)) * 4096  # no format's signature: a raw disk

Host = tuple[Backend, LibvirtConnection]


@dataclass
class ImageServer:
    base: str
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[ImageServer]:
    """A real HTTP server on 127.0.0.1 serving the image, a redirect and a 404."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            served = {"/image.qcow2": IMAGE, "/backed.qcow2": BACKED_IMAGE}.get(self.path)
            if served is not None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(served)))
                self.end_headers()
                self.wfile.write(served)
            elif self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", self.path.split("?to=", 1)[1])
                self.end_headers()
            else:
                self.send_error(404)

        def log_message(self, *_: object) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield ImageServer(base=f"http://127.0.0.1:{httpd.server_address[1]}", requests=seen)
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    backend, connection = make_backend(
        isolated_host_uri(tmp_path),
        ManualClock(),
        volume_writer=write_pool_file,
        allow_loopback_urls=True,
    )
    yield backend, connection
    connection.close()


def pool_volumes(connection: LibvirtConnection) -> set[str]:
    return set(
        ok(connection.call(lambda conn: conn.storagePoolLookupByName("default").listVolumes()))
    )


def from_url(url: str, **source: str) -> PrepareImageRequest:
    return PrepareImageRequest(source=ImageSource(url=url, **source), target_name="fetched")


@pytest.mark.parametrize("algorithm", ["sha256", "sha512", "md5"])
def test_a_url_image_is_downloaded_verified_and_stored_once(
    host: Host, server: ImageServer, algorithm: str
) -> None:
    backend, connection = host
    checksum = hashlib.new(algorithm, IMAGE).hexdigest()
    request = from_url(f"{server.base}/image.qcow2", checksum=checksum, checksum_type=algorithm)
    prepared = ok(present(backend.images).prepare_image(request))
    assert prepared.id == "fetched"
    assert Path(prepared.path).name == "fetched.qcow2"
    assert Path(prepared.path).read_bytes() == IMAGE
    assert (
        ok(present(backend.images).prepare_image(request)) == prepared
    )  # idempotent: no second download
    assert server.requests == ["/image.qcow2"]
    assert pool_volumes(connection) == {"fetched.qcow2"}


def test_sha256_is_the_default_checksum_type(host: Host, server: ImageServer) -> None:
    backend, _ = host
    checksum = hashlib.sha256(IMAGE).hexdigest().upper()
    ok(
        present(backend.images).prepare_image(
            from_url(f"{server.base}/image.qcow2", checksum=checksum)
        )
    )


def test_a_checksum_mismatch_is_invalid_and_leaves_no_volume(
    host: Host, server: ImageServer
) -> None:
    backend, connection = host
    wrong = hashlib.sha256(b"another image").hexdigest()
    error = error_of(
        present(backend.images).prepare_image(
            from_url(f"{server.base}/image.qcow2", checksum=wrong)
        )
    )
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("source.checksum:")
    assert pool_volumes(connection) == set()


def test_a_qcow2_naming_a_backing_file_is_refused_before_anything_is_stored(
    host: Host, server: ImageServer
) -> None:
    backend, connection = host
    error = error_of(present(backend.images).prepare_image(from_url(f"{server.base}/backed.qcow2")))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("source.url:")
    assert "backing file" in error.message
    assert pool_volumes(connection) == set()


def test_an_image_that_is_not_the_format_the_spec_says_is_refused(
    host: Host, server: ImageServer
) -> None:
    backend, connection = host
    error = error_of(
        present(backend.images).prepare_image(from_url(f"{server.base}/image.qcow2", format="raw"))
    )
    assert error.kind is ErrorKind.INVALID_SPEC
    assert "source.format: the image is qcow2, not raw" in error.message
    assert pool_volumes(connection) == set()


def test_an_unknown_checksum_type_is_refused_before_any_request(
    host: Host, server: ImageServer
) -> None:
    backend, _ = host
    request = from_url(f"{server.base}/image.qcow2", checksum="ab", checksum_type="crc32")
    error = error_of(present(backend.images).prepare_image(request))
    assert (error.kind, error.message.split(":")[0]) == (
        ErrorKind.INVALID_SPEC,
        "source.checksum_type",
    )
    assert server.requests == []


def test_an_http_error_is_unavailable_and_leaves_no_volume(host: Host, server: ImageServer) -> None:
    backend, connection = host
    error = error_of(
        present(backend.images).prepare_image(from_url(f"{server.base}/missing.qcow2"))
    )
    assert error.kind is ErrorKind.UNAVAILABLE
    assert "404" in error.message
    assert pool_volumes(connection) == set()


def test_loopback_is_refused_without_the_setting(tmp_path: Path, server: ImageServer) -> None:
    backend, connection = make_backend(
        isolated_host_uri(tmp_path), ManualClock(), volume_writer=write_pool_file
    )
    try:
        for base in (server.base, server.base.replace("127.0.0.1", "localhost")):
            error = error_of(present(backend.images).prepare_image(from_url(f"{base}/image.qcow2")))
            assert error.kind is ErrorKind.INVALID_SPEC
            assert error.message.startswith("source.url:")
            assert "loopback" in error.message
        assert server.requests == []
        assert pool_volumes(connection) == set()
    finally:
        connection.close()


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/x", "file:///etc/passwd"]
)
def test_link_local_metadata_and_non_http_urls_are_refused_even_with_loopback_allowed(
    host: Host, url: str
) -> None:
    backend, _ = host
    error = error_of(present(backend.images).prepare_image(from_url(url)))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("source.url:")


NAMED = DownloadFields("url", "checksum", "checksumType")


def test_a_redirect_is_followed_and_its_target_checked_too(server: ImageServer) -> None:
    followed = ok(
        open_download(
            f"{server.base}/redirect?to={server.base}/image.qcow2",
            checksum="",
            checksum_type="",
            allow_loopback=True,
            named=NAMED,
        )
    )
    assert ok(followed.chunks.consumed_by(b"".join)) == IMAGE
    refused = error_of(
        open_download(
            f"{server.base}/redirect?to=http://169.254.169.254/",
            checksum="",
            checksum_type="",
            allow_loopback=True,
            named=NAMED,
        )
    )
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert refused.message.startswith("url: ")
    assert "metadata" in refused.message


def test_a_checksum_mismatch_is_what_reading_the_downloads_chunks_answers(
    server: ImageServer,
) -> None:
    mismatched = ok(
        open_download(
            f"{server.base}/image.qcow2",
            checksum="0" * 64,
            checksum_type="",
            allow_loopback=True,
            named=NAMED,
        )
    )
    given: list[bytes] = []
    error = error_of(mismatched.chunks.consumed_by(given.extend))
    assert b"".join(given) == IMAGE
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("checksum: the sha256 of the downloaded image is ")


def test_a_closed_port_is_unavailable() -> None:
    result = open_download(
        "http://127.0.0.1:9/x", checksum="", checksum_type="", allow_loopback=True, named=NAMED
    )
    assert error_of(result).kind is ErrorKind.UNAVAILABLE


def test_the_stream_upload_is_unsupported_on_the_test_driver(
    tmp_path: Path, server: ImageServer
) -> None:
    backend, connection = make_backend(
        isolated_host_uri(tmp_path), ManualClock(), allow_loopback_urls=True
    )
    try:
        error = error_of(
            present(backend.images).prepare_image(from_url(f"{server.base}/image.qcow2"))
        )
        assert error.kind is ErrorKind.UNSUPPORTED
        assert "virStorageVolUpload" in error.message
        assert pool_volumes(connection) == set()
    finally:
        connection.close()


def test_a_host_file_is_imported_into_the_pool(host: Host, tmp_path: Path) -> None:
    backend, _ = host
    image = tmp_path / "disk.raw"
    image.write_bytes(RAW_IMAGE)
    request = PrepareImageRequest(
        source=ImageSource(path=str(image), format="raw"), target_name="from-file"
    )
    prepared = ok(present(backend.images).prepare_image(request))
    assert Path(prepared.path).name == "from-file.raw"
    assert Path(prepared.path).read_bytes() == RAW_IMAGE


def test_a_host_file_is_judged_like_a_download(host: Host, tmp_path: Path) -> None:
    """A qcow2 on the host naming a backing file is refused by the path it was given as, and
    a qcow2 declared raw is refused by the format: nothing is stored."""
    backend, connection = host
    backed = tmp_path / "backed.qcow2"
    backed.write_bytes(BACKED_IMAGE)
    request = PrepareImageRequest(source=ImageSource(path=str(backed)), target_name="backed")
    error = error_of(present(backend.images).prepare_image(request))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("source.path:")
    assert "backing file" in error.message
    disguised = tmp_path / "disk.raw"
    disguised.write_bytes(IMAGE)
    request = PrepareImageRequest(
        source=ImageSource(path=str(disguised), format="raw"), target_name="disguised"
    )
    error = error_of(present(backend.images).prepare_image(request))
    assert error.message == "source.format: the image is qcow2, not raw"
    assert pool_volumes(connection) == set()


def test_a_volume_is_copied_and_vms_from_it_get_their_own_overlays(host: Host) -> None:
    backend, connection = host
    base = add_base_image(connection)
    request = PrepareImageRequest(source=ImageSource(path=base), target_name="golden")
    prepared = ok(present(backend.images).prepare_image(request))
    assert (prepared.id, Path(prepared.path).name) == ("golden", "golden.qcow2")
    disks = []
    for name in ("vm-a", "vm-b"):
        create = CreateRequest(
            name=name, vm_class=VMClass(cpu=1, memory_mib=256), image=VMImage(path=prepared.path)
        )
        vm_id = ok(create_vm(backend, create, OWNER))
        disks.append(ok(present(backend.disk_transfer).disk_details(DiskQuery(vm_id=vm_id))))
    assert disks[0].path != disks[1].path
    assert {disk.backing_file for disk in disks} == {prepared.path}


@pytest.mark.parametrize(
    ("source", "storage_hint", "field"),
    [
        (ImageSource(path="/nowhere/disk.qcow2"), "", "source.path"),
        (ImageSource(path="relative.qcow2"), "", "source.path"),
        (ImageSource(template_name="ubuntu"), "", "source.template_name"),
        (ImageSource(url="http://192.0.2.1/x.qcow2", format="vmdk"), "", "source.format"),
        (ImageSource(url="http://192.0.2.1/x.qcow2"), "nope", "storage_hint"),
        (
            ImageSource(url="http://192.0.2.1/x.qcow2", storage_pool="nope"),
            "",
            "source.storage_pool",
        ),
    ],
)
def test_bad_sources_are_invalid_specs_naming_the_field(
    host: Host, source: ImageSource, storage_hint: str, field: str
) -> None:
    backend, _ = host
    request = PrepareImageRequest(source=source, target_name="bad", storage_hint=storage_hint)
    error = error_of(present(backend.images).prepare_image(request))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith(f"{field}:")
