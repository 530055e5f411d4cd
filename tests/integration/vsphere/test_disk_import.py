"""A streamOptimized VMDK landed on a simulator datastore through an NFC import lease: the
bytes that reach the datastore are the bytes sent, no VM is left behind, Create builds a VM
around the disk, and a failed import leaves neither a VM nor a folder. Also the small datastore
files the import's caller keeps beside a disk."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest
from pyVim.task import WaitForTask
from returns.result import Result

from pyrigaud.adapters.hypervisors.vsphere import datastore_files, disk_import, ovf_import
from pyrigaud.adapters.hypervisors.vsphere.calls import attempt
from pyrigaud.adapters.hypervisors.vsphere.disk_import import import_stream_optimized
from pyrigaud.adapters.hypervisors.vsphere.placement import (
    Location,
    named_entity,
    resolve_on_datastore,
)
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve_all_vms
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import building_marks
from pyrigaud.application.backend import Backend
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import CreateRequest, OwnerMark, Placement, VMClass, VMImage

from contract.harness import made
from support import error_of, ok
from support.ova import DATASTORE, stream_optimized_vmdk
from support.vsphere import vim, vm_ref

OWNER = OwnerMark(provider="tests/vsphere-disk-import")
RAW = random.Random(20261203).randbytes(1024 * 1024)


@pytest.fixture
def location(instance: Any) -> Location:
    datastore = ok(named_entity(instance, vim.Datastore, DATASTORE, fields.STORAGE_HINT))
    return ok(resolve_on_datastore(instance, Placement(), datastore))


@pytest.fixture(scope="module")
def vmdk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RAW as qemu-img's streamOptimized VMDK, in a file (as the import's caller stages it)."""
    workdir = tmp_path_factory.mktemp("vmdk")
    path = workdir / "staged.vmdk"
    path.write_bytes(stream_optimized_vmdk(RAW, workdir))
    return path


@pytest.fixture
def folders(instance: Any) -> Iterator[list[str]]:
    """Datastore folders a test names; each is deleted after the test."""
    names: list[str] = []
    yield names
    for name in names:
        ok(datastore_files.delete(instance, name))


def _vm_names(instance: Any) -> set[str]:
    return {str(row["name"]) for row in retrieve_all_vms(instance, ("name",))}


def _import(
    instance: Any, reader: BinaryIO, size: int, name: str, location: Location
) -> Result[str, ProviderError]:
    """The import through the package's edge, as the ImportDisk glue calls it."""
    return attempt(
        f"importing disk {name!r}",
        lambda: import_stream_optimized(
            instance,
            reader,
            size,
            name,
            location,
            len(RAW),
            marks=building_marks(OWNER.provider, time.time()),
        ),
    )


def test_the_disk_lands_with_the_bytes_sent_and_no_vm_stays(
    backend: Backend, instance: Any, location: Location, vmdk: Path, folders: list[str]
) -> None:
    name = "vs-import-landed"
    folders.append(f"[{DATASTORE}] {name}")
    with vmdk.open("rb") as reader:
        path = ok(_import(instance, reader, vmdk.stat().st_size, name, location))

    assert path.startswith(f"[{DATASTORE}] {name}/")
    assert path.endswith(".vmdk")
    sent = vmdk.read_bytes()
    assert ok(datastore_files.read_small(instance, path, limit=len(sent))) == sent
    assert name not in _vm_names(instance)

    image = VMImage(template_name="", path=path, url="", format="vmdk", checksum_type="sha256")
    request = CreateRequest(name=f"{name}-vm", vm_class=VMClass(cpu=1, memory_mib=256), image=image)
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request, OWNER))
    vm = vm_ref(instance, vm_id)
    disks = [
        str(device.backing.fileName)
        for device in vm.config.hardware.device
        if isinstance(device, vim.vm.device.VirtualDisk)
    ]
    assert disks == [path]
    ok(backend.lifecycle.delete(vm_id))


def test_names_that_xml_would_misread_are_carried_as_text(
    instance: Any, location: Location, vmdk: Path, folders: list[str]
) -> None:
    name = "vs-import <&'\"> x"
    folders.append(f"[{DATASTORE}] {name}")
    with vmdk.open("rb") as reader:
        path = ok(_import(instance, reader, vmdk.stat().st_size, name, location))
    assert path.startswith(f"[{DATASTORE}] {name}/")
    assert name not in _vm_names(instance)


class _FailingReader:
    """A staged file whose read fails after the first chunk (a disk error mid-upload)."""

    def __init__(self, reader: BinaryIO) -> None:
        self._reader = reader
        self.reads = 0

    def seek(self, offset: int) -> int:
        return self._reader.seek(offset)

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise OSError("the scratch disk failed")
        return self._reader.read(size)


def test_a_failure_mid_upload_leaves_no_vm_and_no_folder(
    instance: Any, location: Location, vmdk: Path, folders: list[str]
) -> None:
    name = "vs-import-broken"
    folder = f"[{DATASTORE}] {name}"
    folders.append(folder)
    with vmdk.open("rb") as staged:
        reader = cast(BinaryIO, _FailingReader(staged))
        raised = error_of(_import(instance, reader, vmdk.stat().st_size, name, location))

    assert raised.kind is ErrorKind.UNAVAILABLE
    assert "scratch disk failed" in raised.message
    assert name not in _vm_names(instance)
    assert not ok(datastore_files.exists(instance, folder))


def test_a_failure_after_the_lease_deletes_the_folder_with_the_disk(
    instance: Any,
    location: Location,
    vmdk: Path,
    folders: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once detached, the disk is no longer the VM's, so destroying the VM would keep it on
    vCenter (the simulator's Destroy_Task removes the whole home folder instead): here the VM
    is detached from and unregistered before the failure, so only the folder's deletion can
    take the files away."""
    name = "vs-import-late-failure"
    folder = f"[{DATASTORE}] {name}"
    folders.append(folder)
    detached: list[str] = []

    def detach_then_fail(instance: Any, vm: Any) -> Result[str, ProviderError]:
        disk = next(
            d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk)
        )
        removal = vim.vm.device.VirtualDeviceSpec(operation="remove", device=disk)
        WaitForTask(vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=[removal])))
        vm.UnregisterVM()
        detached.append(str(disk.backing.fileName))
        raise vim.fault.InvalidState(msg="a late failure")

    monkeypatch.setattr(disk_import, "_keep_disk", detach_then_fail)
    with vmdk.open("rb") as reader:
        raised = error_of(_import(instance, reader, vmdk.stat().st_size, name, location))

    assert raised.kind is ErrorKind.FAILED_PRECONDITION
    assert detached
    assert detached[0].startswith(f"{folder}/")
    assert name not in _vm_names(instance)
    assert not ok(datastore_files.exists(instance, folder))


def test_an_existing_folder_is_already_exists_and_left_alone(
    instance: Any, location: Location, vmdk: Path, folders: list[str]
) -> None:
    name = "vs-import-taken"
    folder = f"[{DATASTORE}] {name}"
    folders.append(folder)
    ok(datastore_files.write_small(instance, f"{folder}/theirs.txt", b"not yours"))
    with vmdk.open("rb") as reader:
        raised = error_of(_import(instance, reader, vmdk.stat().st_size, name, location))

    assert raised.kind is ErrorKind.ALREADY_EXISTS
    assert ok(datastore_files.read_small(instance, f"{folder}/theirs.txt")) == b"not yours"
    assert name not in _vm_names(instance)


def test_small_datastore_files_round_trip(instance: Any, folders: list[str]) -> None:
    folder = f"[{DATASTORE}] vs-files"
    folders.append(folder)
    record = f"{folder}/disk [1]*.json"  # wildcard characters are matched as themselves
    assert ok(datastore_files.read_small(instance, record)) is None
    assert not ok(datastore_files.exists(instance, record))
    assert not ok(datastore_files.exists(instance, folder))

    ok(datastore_files.write_small(instance, record, b'{"sha256": "ab"}'))
    ok(datastore_files.write_small(instance, f"{folder}/disk 11x.json", b"other"))
    assert ok(datastore_files.read_small(instance, record)) == b'{"sha256": "ab"}'
    assert ok(datastore_files.exists(instance, record))
    assert ok(datastore_files.exists(instance, folder))
    assert not ok(datastore_files.exists(instance, f"{folder}/disk [1].json"))

    ok(datastore_files.write_small(instance, record, b"{}"))  # replaced whole
    assert ok(datastore_files.read_small(instance, record)) == b"{}"

    ok(datastore_files.delete(instance, record))
    assert not ok(datastore_files.exists(instance, record))
    assert ok(datastore_files.read_small(instance, record)) is None
    ok(datastore_files.delete(instance, record))  # already gone: fine
    ok(datastore_files.delete(instance, folder))
    assert not ok(datastore_files.exists(instance, folder))


def test_a_file_larger_than_the_limit_is_never_read_whole(
    instance: Any, folders: list[str]
) -> None:
    folder = f"[{DATASTORE}] vs-files-big"
    folders.append(folder)
    ok(datastore_files.write_small(instance, f"{folder}/big", b"x" * 100))
    raised = error_of(datastore_files.read_small(instance, f"{folder}/big", limit=99))
    assert raised.kind is ErrorKind.FAILED_PRECONDITION
    assert ok(datastore_files.read_small(instance, f"{folder}/big", limit=100)) == b"x" * 100


def test_an_unknown_datastore_is_not_found(instance: Any) -> None:
    raised = error_of(datastore_files.exists(instance, "[NoSuchDS] dir/file"))
    assert raised.kind is ErrorKind.NOT_FOUND


def test_an_import_that_loses_its_name_meanwhile_leaves_the_winner_alone(
    instance: Any,
    location: Location,
    vmdk: Path,
    folders: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another import of the same name (another replica's) makes the folder after this one
    checked it: vCenter puts this import's VM in a folder beside it; this import gives up,
    removes only its own VM and folder, and the other import's files stay."""
    name = "vs-import-raced"
    folder = f"[{DATASTORE}] {name}"
    folders.append(folder)
    theirs = f"{folder}/{name}.vmx"
    checked_then_import_spec = ovf_import.import_spec

    def another_import_gets_there_first(*args: Any, **kwargs: Any) -> Any:
        ok(datastore_files.write_small(instance, theirs, b"the other import's VM"))
        return checked_then_import_spec(*args, **kwargs)

    monkeypatch.setattr(disk_import, "import_spec", another_import_gets_there_first)
    with vmdk.open("rb") as reader:
        raised = error_of(_import(instance, reader, vmdk.stat().st_size, name, location))

    assert raised.kind is ErrorKind.ALREADY_EXISTS
    assert "another import" in raised.message
    assert ok(datastore_files.read_small(instance, theirs)) == b"the other import's VM"
    assert name not in _vm_names(instance)
    beside = [vm for vm in _vm_names(instance) if vm.startswith(name)]
    assert beside == []
