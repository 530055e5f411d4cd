"""ImagePrepare on the vCenter simulator: an OVA or OVF served on loopback is downloaded, its
checksum verified, imported through an NFC lease and marked as a template; the disk's bytes are
read back from the datastore and compared with what was sent."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyVim.task import WaitForTask

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.vsphere.backend import vsphere_backend
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve_all_vms
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import BUILDING_KEY, OWNER_KEY
from pyrigaud.application.backend import Backend
from pyrigaud.application.use_cases.prepare_image import PrepareImage
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    ContentLibraryItem,
    ImageSource,
    OwnerMark,
    Placement,
    PreparedImage,
    PrepareImageRequest,
)

from contract.harness import made
from support import error_kind, error_of, ok
from support.disk_image import qemu_img
from support.image_server import ImageServer, serving
from support.ova import (
    DATASTORE,
    datastore_file_exists,
    ova_of,
    ovf_descriptor,
    read_datastore_file,
    tiny_disk,
)
from support.transfer import IMAGE_JUDGE
from support.vsphere import (
    TEMPLATE_VM,
    Simulator,
    template_request,
    vim,
    vm_ref,
)

OWNER = OwnerMark(provider="tests/vsphere-images")


@pytest.fixture
def images_backend(simulator: Simulator) -> Backend:
    """The backend as `pyrigaud serve` builds it with PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK set."""
    return vsphere_backend(
        simulator.session(),
        defaults=Placement(),
        clock=SystemClock(),
        allow_loopback_urls=True,
        owner=OWNER.provider,
        image_judge=IMAGE_JUDGE,
    )


@pytest.fixture(scope="module")
def disk(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    return tiny_disk(tmp_path_factory.mktemp("ova"))


@pytest.fixture
def ova(disk: tuple[bytes, bytes]) -> bytes:
    raw, vmdk = disk
    return ova_of(ovf_descriptor(vmdk, len(raw)), vmdk)


@pytest.fixture
def imported(instance: Any) -> Iterator[list[str]]:
    """Names of the templates a test imports; each is destroyed after the test."""
    names: list[str] = []
    yield names
    for name in names:
        for vm in _named(instance, name):
            WaitForTask(vm.Destroy_Task())


def _named(instance: Any, name: str) -> list[Any]:
    """The VMs and templates called `name`, found through the property collector."""
    return [row["_ref"] for row in retrieve_all_vms(instance, ("name",)) if row["name"] == name]


def _disk_path(vm: Any) -> str:
    disks = [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk)]
    assert len(disks) == 1
    return str(disks[0].backing.fileName)


def _ova_request(
    server: ImageServer, name: str, *, checksum: str = "", checksum_type: str = "", path: str = ""
) -> PrepareImageRequest:
    return PrepareImageRequest(
        source=ImageSource(
            origin="vsphere",
            url=server.url(path or "/tiny.ova"),
            checksum=checksum,
            checksum_type=checksum_type,
        ),
        target_name=name,
        storage_hint=DATASTORE,
    )


@pytest.mark.parametrize("algorithm", ["sha256", "sha1", "md5", "sha512"])
def test_an_ova_becomes_a_template_whose_disk_holds_the_uploaded_bytes(
    images_backend: Backend,
    simulator: Simulator,
    instance: Any,
    imported: list[str],
    ova: bytes,
    disk: tuple[bytes, bytes],
    algorithm: str,
) -> None:
    name = f"vs-ova-{algorithm}"
    imported.append(name)
    digest = hashlib.new(algorithm, ova).hexdigest().upper()  # hex compares case-insensitively
    with serving({"/tiny.ova": ova}) as server:
        request = _ova_request(server, name, checksum=digest, checksum_type=algorithm)
        assert images_backend.images is not None
        assert ok(images_backend.images.prepare_image(request)) == PreparedImage(id=name)
        again = ok(images_backend.images.prepare_image(request))
    assert again == PreparedImage(id=name)
    assert server.requests == ["/tiny.ova"]  # the second call found the template by name
    template = _named(instance, name)[0]
    assert template.config.template
    disk_path = _disk_path(template)
    assert disk_path.startswith(f"[{DATASTORE}] ")
    assert disk_path.endswith(".vmdk")
    assert read_datastore_file(simulator, instance, disk_path) == disk[1]


def test_a_bare_ovf_url_fetches_its_disk_from_beside_it(
    images_backend: Backend,
    simulator: Simulator,
    instance: Any,
    imported: list[str],
    disk: tuple[bytes, bytes],
) -> None:
    raw, vmdk = disk
    descriptor = ovf_descriptor(vmdk, len(raw))
    imported.append("vs-ovf")
    served = {"/images/tiny.ovf": descriptor, "/images/tiny-disk1.vmdk": vmdk}
    with serving(served) as server:
        request = _ova_request(
            server,
            "vs-ovf",
            checksum=hashlib.sha256(descriptor).hexdigest(),
            path="/images/tiny.ovf",
        )
        assert images_backend.images is not None
        ok(images_backend.images.prepare_image(request))
    assert server.requests == ["/images/tiny.ovf", "/images/tiny-disk1.vmdk"]
    template = _named(instance, "vs-ovf")[0]
    assert read_datastore_file(simulator, instance, _disk_path(template)) == vmdk


def test_a_checksum_mismatch_imports_nothing(
    images_backend: Backend, simulator: Simulator, instance: Any, ova: bytes
) -> None:
    with serving({"/tiny.ova": ova}) as server:
        request = _ova_request(server, "vs-ova-bad-sum", checksum="0" * 64)
        assert images_backend.images is not None
        result = images_backend.images.prepare_image(request)
    assert error_kind(result) is ErrorKind.INVALID_SPEC
    assert error_of(result).message.startswith("source.checksum:")
    assert not _named(instance, "vs-ova-bad-sum")
    assert not datastore_file_exists(simulator, instance, f"[{DATASTORE}] vs-ova-bad-sum/")


def test_a_disk_the_ova_lacks_leaves_no_vm_and_no_files(
    images_backend: Backend, simulator: Simulator, instance: Any, disk: tuple[bytes, bytes]
) -> None:
    """The descriptor references a disk the OVA lacks: found before anything is uploaded."""
    raw, vmdk = disk
    broken = ova_of(ovf_descriptor(vmdk, len(raw), disk_name="missing.vmdk"), vmdk)
    with serving({"/tiny.ova": broken}) as server:
        assert images_backend.images is not None
        result = images_backend.images.prepare_image(_ova_request(server, "vs-ova-broken"))
    assert error_kind(result) is ErrorKind.INVALID_SPEC
    assert "missing.vmdk" in error_of(result).message
    assert not _named(instance, "vs-ova-broken")
    assert not datastore_file_exists(simulator, instance, f"[{DATASTORE}] vs-ova-broken/")


@pytest.mark.parametrize(
    ("disguise", "problem"),
    [
        ("qcow2", "the image is qcow2, not a vmdk (the package's disk 'tiny-disk1.vmdk')"),
        ("cut short", "the vmdk ends inside a grain (the package's disk 'tiny-disk1.vmdk')"),
    ],
)
def test_a_disk_that_is_no_whole_vmdk_is_refused_before_vcenter_sees_it(
    images_backend: Backend,
    simulator: Simulator,
    instance: Any,
    disk: tuple[bytes, bytes],
    tmp_path: Path,
    disguise: str,
    problem: str,
) -> None:
    """The package's disk is judged whole: a qcow2 under a vmdk's name, or a vmdk cut short,
    is refused naming the package's URL; no VM and no file is left."""
    raw, vmdk = disk
    if disguise == "qcow2":
        (tmp_path / "disk.raw").write_bytes(raw)
        qemu_img("convert", "-O", "qcow2", tmp_path / "disk.raw", tmp_path / "disk.qcow2")
        bad = (tmp_path / "disk.qcow2").read_bytes()
    else:
        bad = vmdk[: len(vmdk) // 2]  # its grain directory, at the end, is gone
    name = f"vs-ova-{disguise.replace(' ', '-')}"
    with serving({"/tiny.ova": ova_of(ovf_descriptor(bad, len(raw)), bad)}) as server:
        assert images_backend.images is not None
        result = images_backend.images.prepare_image(_ova_request(server, name))
    error = error_of(result)
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith(f"{fields.PREPARE_OVA_URL}:")
    assert problem in error.message
    assert not _named(instance, name)
    assert not datastore_file_exists(simulator, instance, f"[{DATASTORE}] {name}/")


@pytest.mark.parametrize(
    ("url", "allow_loopback", "problem"),
    [
        ("http://169.254.169.254/latest/x.ova", True, "metadata"),
        ("http://[fe80::1]/x.ova", True, "link-local"),
        ("ftp://images.example/x.ova", True, "only http and https"),
        ("LOOPBACK", False, "loopback"),
    ],
)
def test_the_url_rules_refuse_before_any_traffic(
    simulator: Simulator, ova: bytes, url: str, allow_loopback: bool, problem: str
) -> None:
    backend = vsphere_backend(
        simulator.session(),
        defaults=Placement(),
        clock=SystemClock(),
        allow_loopback_urls=allow_loopback,
        owner=OWNER.provider,
        image_judge=IMAGE_JUDGE,
    )
    with serving({"/tiny.ova": ova}) as server:
        source = ImageSource(
            origin="vsphere", url=server.url("/tiny.ova") if url == "LOOPBACK" else url
        )
        request = PrepareImageRequest(source=source, target_name="vs-ova-refused")
        assert backend.images is not None
        result = backend.images.prepare_image(
            request.model_copy(update={"storage_hint": DATASTORE})
        )
    assert error_kind(result) is ErrorKind.INVALID_SPEC
    assert error_of(result).message.startswith("source.ova_url:")
    assert problem in error_of(result).message
    assert server.requests == []


def test_an_unknown_checksum_type_is_refused_before_any_traffic(
    images_backend: Backend, ova: bytes
) -> None:
    with serving({"/tiny.ova": ova}) as server:
        request = _ova_request(server, "vs-ova-crc", checksum="abc", checksum_type="crc32")
        assert images_backend.images is not None
        result = images_backend.images.prepare_image(request)
    assert error_kind(result) is ErrorKind.INVALID_SPEC
    assert error_of(result).message.startswith("source.checksum_type:")
    assert server.requests == []


def test_a_template_name_is_only_verified(images_backend: Backend) -> None:
    assert images_backend.images is not None
    prepare = images_backend.images.prepare_image
    found = prepare(
        PrepareImageRequest(
            source=ImageSource(origin="vsphere", template_name=TEMPLATE_VM), target_name="vs-alias"
        )
    )
    assert ok(found) == PreparedImage(id=TEMPLATE_VM)
    missing = prepare(
        PrepareImageRequest(
            source=ImageSource(origin="vsphere", template_name="no-such-template"),
            target_name="vs-alias",
        )
    )
    assert error_kind(missing) is ErrorKind.NOT_FOUND


def test_a_content_library_is_unimplemented_and_named(images_backend: Backend) -> None:
    library = ContentLibraryItem(library="lib", item="ubuntu")
    request = PrepareImageRequest(
        source=ImageSource(origin="vsphere", content_library=library), target_name="vs-library"
    )
    prepare = PrepareImage(images_backend.images, images_backend.capabilities)  # type: ignore[arg-type]
    result = prepare(request)
    assert error_kind(result) is ErrorKind.UNSUPPORTED
    assert error_of(result).field == fields.PREPARE_CONTENT_LIBRARY


def test_a_vm_is_created_from_the_prepared_template(
    images_backend: Backend, instance: Any, imported: list[str], ova: bytes
) -> None:
    assert images_backend.capabilities.capabilities().supports_image_import
    imported.append("vs-ova-base")
    with serving({"/tiny.ova": ova}) as server:
        prepare = PrepareImage(images_backend.images, images_backend.capabilities)  # type: ignore[arg-type]
        prepared = ok(prepare(_ova_request(server, "vs-ova-base")))
    request = template_request("vs-from-ova", cpu=1, memory_mib=256)
    request = request.model_copy(
        update={"image": request.image.model_copy(update={"template_name": prepared.id})}
    )
    vm_id = made(images_backend.tasks, images_backend.lifecycle.start_create(request, OWNER))
    try:
        vm = vm_ref(instance, vm_id)
        assert vm.name == "vs-from-ova"
        assert not vm.config.template
        assert vm.config.hardware.numCPU == 1
    finally:
        ok(images_backend.lifecycle.delete(vm_id))


def test_an_import_not_finished_is_not_taken_for_the_prepared_image(
    images_backend: Backend, instance: Any, imported: list[str], ova: bytes
) -> None:
    """The imported VM carries the building mark until it is a template: a VM of the name a
    killed provider left still marked is UNAVAILABLE (the sweep removes it), never the image."""
    name = "vs-ova-unfinished"
    imported.append(name)
    assert images_backend.images is not None
    with serving({"/tiny.ova": ova}) as server:
        ok(images_backend.images.prepare_image(_ova_request(server, name)))
        template = _named(instance, name)[0]
        marks = {option.key: option.value for option in template.config.extraConfig}
        assert marks[OWNER_KEY] == OWNER.provider
        assert not marks.get(BUILDING_KEY)
        left = _named(instance, TEMPLATE_VM)[0]  # stands for the VM a killed import left
        _set_building_mark(left, "1")
        try:
            unfinished = images_backend.images.prepare_image(_ova_request(server, TEMPLATE_VM))
        finally:
            _set_building_mark(left, "")
    assert error_kind(unfinished) is ErrorKind.UNAVAILABLE
    assert server.requests == ["/tiny.ova"]  # nothing fetched for the unfinished one


def _set_building_mark(vm: Any, value: str) -> None:
    mark = vim.option.OptionValue(key=BUILDING_KEY, value=value)
    WaitForTask(vm.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=[mark])))
