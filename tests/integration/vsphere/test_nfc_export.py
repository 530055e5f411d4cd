"""Disk bytes out of the vCenter simulator through NFC export leases (ExportVm, ExportSnapshot):
what qemu-img reads from the exported streamOptimized vmdk is compared byte for byte with the
disk that went in; the lease ends complete, or aborted when the reader fails."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyVim.task import WaitForTask
from pyVmomi import vmodl as untyped_vmodl
from returns.result import Result

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.vsphere.backend import vsphere_backend
from pyrigaud.adapters.hypervisors.vsphere.nfc_export import ExportedDisk, export_disk
from pyrigaud.adapters.hypervisors.vsphere.nfc_lease import CHUNK_BYTES, receive_from_lease
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve
from pyrigaud.adapters.hypervisors.vsphere.tasks import wait
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import ImageSource, Placement, PrepareImageRequest

from support import error_of, ok
from support.image_server import serving
from support.ova import DATASTORE, ova_of, ovf_descriptor, stream_optimized_vmdk
from support.transfer import IMAGE_JUDGE
from support.vsphere import TEMPLATE_VM, Simulator, vim

vmodl: Any = untyped_vmodl  # pyVmomi's fault classes are untyped

MIB = 1024 * 1024
IMPORTED = "vs-nfc-export"


class ReaderFailedError(Exception):
    """What the code reading an export raises in the abort test."""


@pytest.fixture(scope="module")
def instance(simulator: Simulator) -> Iterator[Any]:
    session = simulator.session()
    yield session.call(lambda connection: connection)
    session.close()


@pytest.fixture(scope="module")
def raw() -> bytes:
    """Random data, a run of zeros (which a streamOptimized vmdk leaves out), random data."""
    return os.urandom(2 * MIB) + bytes(MIB) + os.urandom(MIB)


@pytest.fixture(scope="module")
def imported_vm(
    simulator: Simulator, instance: Any, raw: bytes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A powered-off VM whose disk holds `raw`: an OVA imported by ImagePrepare (which sends
    the vmdk through an import lease), turned from a template back into a VM."""
    vmdk = stream_optimized_vmdk(raw, tmp_path_factory.mktemp("nfc-export"))
    session = simulator.session()
    backend = vsphere_backend(
        session,
        defaults=Placement(),
        clock=SystemClock(),
        allow_loopback_urls=True,
        owner="tests/vsphere-nfc-export",
        image_judge=IMAGE_JUDGE,
    )
    assert backend.images is not None
    with serving({"/disk.ova": ova_of(ovf_descriptor(vmdk, len(raw)), vmdk)}) as server:
        request = PrepareImageRequest(
            source=ImageSource(origin="vsphere", url=server.url("/disk.ova")),
            target_name=IMPORTED,
            storage_hint=DATASTORE,
        )
        ok(backend.images.prepare_image(request))
    session.close()
    vm = instance.content.searchIndex.FindByInventoryPath(f"DC0/vm/{IMPORTED}")
    vm.MarkAsVirtualMachine(pool=_pool(instance))
    yield vm
    WaitForTask(vm.Destroy_Task())


@pytest.fixture
def blank_vm(instance: Any) -> Iterator[Any]:
    """A powered-off clone of the inventory's template: the simulator made its disk blank."""
    template = instance.content.searchIndex.FindByInventoryPath(f"DC0/vm/{TEMPLATE_VM}")
    spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(), powerOn=False, template=False)
    clone = _result(template.CloneVM_Task(folder=template.parent, name="vs-nfc-blank", spec=spec))
    yield clone
    if clone.runtime.powerState != vim.VirtualMachinePowerState.poweredOff:
        WaitForTask(clone.PowerOffVM_Task())
    WaitForTask(clone.Destroy_Task())


def _result(task: Any) -> Any:
    WaitForTask(task)
    return task.info.result


def _pool(instance: Any) -> Any:
    return instance.content.searchIndex.FindByInventoryPath("DC0/host/DC0_C0/Resources")


@contextlib.contextmanager
def exported_disk(
    instance: Any, source: Any, disk_index: int
) -> Iterator[Result[ExportedDisk, ProviderError]]:
    """The export as the disk transfer holds it: the lease ends with the block, completed
    when it ends normally after the disk was opened, aborted otherwise."""
    with contextlib.ExitStack() as holds:
        yield export_disk(instance, source, disk_index, holds)


def _read_all(exported: ExportedDisk, target: Path) -> list[int]:
    """Write the export's bytes to `target`; the size of each chunk read."""
    sizes = []
    with target.open("wb") as out:
        for chunk in exported.chunks():
            sizes.append(len(chunk))
            out.write(chunk)
    return sizes


def _as_raw(vmdk: Path) -> bytes:
    """What qemu-img reads from the vmdk (it fails on a malformed one)."""
    raw = vmdk.with_suffix(".raw")
    subprocess.run(
        ["qemu-img", "convert", "-f", "vmdk", "-O", "raw", str(vmdk), str(raw)], check=True
    )
    return raw.read_bytes()


def _virtual_size(vmdk: Path) -> int:
    info = subprocess.run(
        ["qemu-img", "info", "--output=json", str(vmdk)], check=True, capture_output=True, text=True
    )
    return int(json.loads(info.stdout)["virtual-size"])


def _export_task_ending(instance: Any, vm: Any, method: str) -> tuple[Any, Any]:
    """The state and fault of the latest export task on the VM: vCenter's record of how the
    lease ended. (A task's whole `info` is not read: pyVmomi fails on some simulator tasks.)"""
    recent = instance.content.taskManager.recentTask
    named = [
        row["_ref"]
        for row in retrieve(instance, recent, ("info.descriptionId",))
        if row["info.descriptionId"] == f"VirtualMachine.{method}"
    ]
    rows = [
        row
        for row in retrieve(instance, named, ("info.entity", "info.state", "info.error"))
        if row["info.entity"] == vm
    ]
    assert rows, f"no {method} task on {vm}"
    return rows[-1]["info.state"], rows[-1].get("info.error")


def _lease_is_gone(lease: Any) -> bool:
    """vCenter no longer knows a lease once it is complete or aborted."""
    try:
        lease.state  # noqa: B018 (reading the property asks vCenter)
    except vmodl.fault.ManagedObjectNotFound:
        return True
    return False


def _fail_after_one_chunk(instance: Any, vm: Any, held: list[ExportedDisk]) -> None:
    with exported_disk(instance, vm, 0) as opened:
        exported = ok(opened)
        held.append(exported)
        next(exported.chunks())
        raise ReaderFailedError


def test_a_vm_exports_the_disk_its_import_uploaded(
    instance: Any, imported_vm: Any, raw: bytes, tmp_path: Path
) -> None:
    with exported_disk(instance, imported_vm, 0) as opened:
        exported = ok(opened)
        sizes = _read_all(exported, tmp_path / "disk.vmdk")
    assert exported.size_bytes == (tmp_path / "disk.vmdk").stat().st_size
    assert len(sizes) > 1  # the 4 MiB of mostly random data came in several chunks
    assert max(sizes) <= CHUNK_BYTES
    assert _as_raw(tmp_path / "disk.vmdk") == raw
    assert _lease_is_gone(exported.lease)
    assert _export_task_ending(instance, imported_vm, "exportVm") == ("success", None)


def test_a_snapshot_exports_the_disk_as_it_recorded_it_while_the_vm_runs(
    instance: Any, imported_vm: Any, raw: bytes, tmp_path: Path
) -> None:
    snapshot = _result(
        imported_vm.CreateSnapshot_Task(name="nfc-export", memory=False, quiesce=False)
    )
    WaitForTask(imported_vm.PowerOnVM_Task())
    try:
        with exported_disk(instance, snapshot, 0) as opened:
            exported = ok(opened)
            _read_all(exported, tmp_path / "disk.vmdk")
    finally:
        WaitForTask(imported_vm.PowerOffVM_Task())
        ok(wait(instance, snapshot.RemoveSnapshot_Task(removeChildren=False)))
    assert _as_raw(tmp_path / "disk.vmdk") == raw
    assert _lease_is_gone(exported.lease)
    assert _export_task_ending(instance, imported_vm, "exportSnapshot") == ("success", None)


def test_a_blank_disk_exports_as_zeros_of_its_capacity(
    instance: Any, blank_vm: Any, tmp_path: Path
) -> None:
    disks = [d for d in blank_vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk)]
    capacity = int(disks[0].capacityInKB) * 1024
    with exported_disk(instance, blank_vm, 0) as opened:
        _read_all(ok(opened), tmp_path / "blank.vmdk")
    assert _virtual_size(tmp_path / "blank.vmdk") == capacity
    assert _as_raw(tmp_path / "blank.vmdk") == bytes(capacity)


def test_a_powered_on_vm_is_a_failed_precondition_naming_snapshots(
    instance: Any, blank_vm: Any
) -> None:
    WaitForTask(blank_vm.PowerOnVM_Task())
    with exported_disk(instance, blank_vm, 0) as opened:
        refused = error_of(opened)
    assert refused.kind is ErrorKind.FAILED_PRECONDITION
    assert "powered on" in refused.message
    assert "snapshot_id" in refused.message


def test_a_failing_reader_aborts_the_lease_and_its_error_propagates(
    instance: Any, blank_vm: Any
) -> None:
    held: list[ExportedDisk] = []
    with pytest.raises(ReaderFailedError):
        _fail_after_one_chunk(instance, blank_vm, held)
    assert _lease_is_gone(held[0].lease)
    state, fault = _export_task_ending(instance, blank_vm, "exportVm")
    assert state == "error"
    assert isinstance(fault, vmodl.fault.RequestCanceled)


def test_a_missing_disk_is_not_found_and_aborts_the_lease(instance: Any, blank_vm: Any) -> None:
    with exported_disk(instance, blank_vm, 1) as opened:
        missing = error_of(opened)
    assert missing.kind is ErrorKind.NOT_FOUND
    assert _export_task_ending(instance, blank_vm, "exportVm")[0] == "error"


def test_a_lease_url_vcenter_refuses_is_unavailable(instance: Any) -> None:
    """The GET of a lease that is not (or no longer) there answers 404."""
    url = "https://*/nfc/httpnfclease-0/disk-0.vmdk"
    with contextlib.ExitStack() as holds:
        refused = error_of(receive_from_lease(instance._stub, url, holds))
    assert refused.kind is ErrorKind.UNAVAILABLE
    assert "HTTP 404" in refused.message
