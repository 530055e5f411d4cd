"""Create around a disk the manager imported (the image's Path, TemplateName empty), on the
vCenter simulator: the VM is built around that very file, and Delete takes the disk with it,
except from a VM still marked as building (a crashed Create), which leaves it for the retry."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pyVim.task import WaitForTask

from pyrigaud.adapters.hypervisors.vsphere.vm_rows import BUILDING_KEY, OWNER_KEY
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CreateRequest,
    DiskDefaults,
    DiskSpec,
    NetworkAttachment,
    OwnerMark,
    VMClass,
    VMImage,
)

from contract.harness import made, settle
from support import error_kind, error_of, ok
from support.image_server import raw_image
from support.ova import DATASTORE, datastore_file_exists, read_datastore_file, write_datastore_file
from support.vsphere import Simulator, create_use_case, running_simulator, vim, vm_ref

OWNER = OwnerMark(provider="tests/vsphere-disk-vm")
CONTENT = raw_image(64 * 1024)


def _imported_disk(simulator: Simulator, instance: Any, name: str) -> str:
    """A datastore disk as the launcher's NFC import leaves one ("[ds] dir/name.vmdk" holding
    the uploaded bytes, CONTENT here, beside its empty -flat file)."""
    path = f"[{DATASTORE}] imported-{name}/{name}.vmdk"
    write_datastore_file(simulator, instance, path, CONTENT)
    write_datastore_file(simulator, instance, path.replace(".vmdk", "-flat.vmdk"), b"")
    return path


def _disk_request(name: str, path: str, **changes: object) -> CreateRequest:
    """What the manager's Creating phase sends for a migrated VM: all six VMImage keys."""
    image = VMImage(template_name="", path=path, url="", format="vmdk", checksum_type="sha256")
    base = CreateRequest(name=name, vm_class=VMClass(cpu=2, memory_mib=512), image=image)
    return base.model_copy(update=changes)


def _disk_paths(vm: Any) -> list[str]:
    return [
        str(device.backing.fileName)
        for device in vm.config.hardware.device
        if isinstance(device, vim.vm.device.VirtualDisk)
    ]


def test_a_vm_is_built_around_the_imported_disk_and_delete_takes_the_disk(
    backend: Backend, simulator: Simulator, instance: Any
) -> None:
    path = _imported_disk(simulator, instance, "vs-disk-vm")
    request = _disk_request(
        "vs-disk-vm",
        path,
        networks=(NetworkAttachment(network_name="VM Network"),),
        disks=(DiskSpec(size_gib=1),),
        user_data=b"#cloud-config\n",
    )
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request, OWNER))
    vm = vm_ref(instance, vm_id)
    assert vm.name == "vs-disk-vm"
    assert vm.config.guestId == "otherLinux64Guest"
    assert vm.config.files.vmPathName.startswith(f"[{DATASTORE}] ")
    assert (vm.config.hardware.numCPU, vm.config.hardware.memoryMB) == (2, 512)
    disks = _disk_paths(vm)
    assert disks[0] == path
    assert len(disks) == 2  # the extra disk, made new in the VM's home
    controllers = [
        d
        for d in vm.config.hardware.device
        if isinstance(d, vim.vm.device.VirtualLsiLogicController)
    ]
    assert controllers
    assert (
        sum(isinstance(d, vim.vm.device.VirtualEthernetCard) for d in vm.config.hardware.device)
        == 1
    )
    marks = {option.key: option.value for option in vm.config.extraConfig}
    assert marks[OWNER_KEY] == OWNER.provider
    assert marks["guestinfo.userdata.encoding"] == "base64"
    assert read_datastore_file(simulator, instance, path) == CONTENT  # attached as it was

    listed = next(info for info in ok(backend.inventory.list_vms()) if info.id == vm_id)
    assert listed.disks[0].path == path
    assert ok(backend.inventory.describe(vm_id)) is not None

    ok(backend.lifecycle.delete(vm_id))
    assert vm_ref(instance, vm_id) is None
    assert not datastore_file_exists(simulator, instance, path)  # the VM's own disk by then


def test_create_is_idempotent_under_the_ownership_rule(
    backend: Backend, simulator: Simulator, instance: Any
) -> None:
    path = _imported_disk(simulator, instance, "vs-disk-again")
    create = create_use_case(backend, OWNER)
    request = _disk_request("vs-disk-again", path)
    first = made(backend.tasks, create(request))
    again = ok(create(request))
    assert again.id == first  # the VM this provider made, returned again
    other = create_use_case(backend, OwnerMark(provider="tests/someone-else"))
    assert error_kind(other(request)) is ErrorKind.ALREADY_EXISTS
    ok(backend.lifecycle.delete(first))


def test_static_addresses_build_in_steps_and_end_unmarked(
    backend: Backend, simulator: Simulator, instance: Any
) -> None:
    path = _imported_disk(simulator, instance, "vs-disk-static")
    network = NetworkAttachment(
        network_name="VM Network", static_ip="10.0.0.5", prefix=24, gateway="10.0.0.1"
    )
    request = _disk_request("vs-disk-static", path, networks=(network,))
    created = ok(backend.lifecycle.start_create(request, OWNER))
    assert created.task is None  # made within the call
    vm = vm_ref(instance, created.id)
    marks = {option.key: option.value for option in vm.config.extraConfig}
    assert not marks.get(BUILDING_KEY)
    assert _disk_paths(vm) == [path]
    ok(backend.lifecycle.delete(created.id))


def test_a_vm_left_building_is_deleted_without_its_imported_disk(
    backend: Backend, simulator: Simulator, instance: Any
) -> None:
    """What the crash sweep does with a Create that died between its steps."""
    path = _imported_disk(simulator, instance, "vs-disk-crashed")
    vm_id = made(
        backend.tasks, backend.lifecycle.start_create(_disk_request("vs-disk-crashed", path), OWNER)
    )
    vm = vm_ref(instance, vm_id)
    WaitForTask(
        vm.ReconfigVM_Task(
            vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key=BUILDING_KEY, value="1")])
        )
    )
    assert ok(backend.lifecycle.find_unfinished())  # the sweep sees it
    ok(backend.lifecycle.delete(vm_id))
    assert vm_ref(instance, vm_id) is None
    assert read_datastore_file(simulator, instance, path) == CONTENT


@pytest.mark.parametrize(
    "path",
    ["/var/lib/libvirt/images/disk.qcow2", "[LocalDS_0] dir/disk.qcow2", "[NoSuchDS] dir/x.vmdk"],
)
def test_a_path_that_names_no_datastore_disk_is_an_invalid_spec(
    backend: Backend, path: str
) -> None:
    result = backend.lifecycle.start_create(_disk_request("vs-disk-bad", path), OWNER)
    assert error_kind(result) is ErrorKind.INVALID_SPEC
    assert error_of(result).message.startswith("image.path:")


def test_a_missing_disk_fails_the_create_task_and_leaves_no_vm(
    backend: Backend, instance: Any
) -> None:
    request = _disk_request("vs-disk-missing", f"[{DATASTORE}] nowhere/missing.vmdk")
    created = ok(backend.lifecycle.start_create(request, OWNER))
    assert created.task is not None
    state = settle(backend.tasks, created.task)
    assert state.done
    assert state.error
    assert ok(backend.lifecycle.find_by_name("vs-disk-missing")) is None


def test_two_creates_racing_for_a_name_make_one_vm() -> None:
    """Both replicas find the name free (the launcher holds each CreateVM_Task): vCenter fails
    the second with DuplicateName, and the ownership rule then returns the winner's VM."""
    with running_simulator("-method-delay", "CreateVM_Task=3000") as simulator:
        session = simulator.session()
        instance = session.call(lambda connection: connection)
        path = _imported_disk(simulator, instance, "vs-disk-race")
        replicas = [simulator.backend(), simulator.backend()]
        request = _disk_request("vs-disk-race", path)
        with ThreadPoolExecutor(len(replicas)) as pool:
            started = list(
                pool.map(
                    lambda replica: ok(replica.lifecycle.start_create(request, OWNER)), replicas
                )
            )
        states = [
            settle(replica.tasks, vm.task)
            for replica, vm in zip(replicas, started, strict=True)
            if vm.task is not None
        ]
        assert sorted(bool(state.error) for state in states) == [False, True]
        assert next(state.error for state in states if state.error).startswith("already_exists")
        winner = next(vm for vm, state in zip(started, states, strict=True) if not state.error)
        assert ok(create_use_case(replicas[0], OWNER)(request)).id == winner.id
        session.close()


def test_the_class_root_disk_size_grows_the_attached_disk(
    backend: Backend, simulator: Simulator, instance: Any
) -> None:
    path = _imported_disk(simulator, instance, "vs-disk-grown")
    vm_class = VMClass(cpu=1, memory_mib=256, disk_defaults=DiskDefaults(size_gib=3))
    created = ok(
        create_use_case(backend, OWNER)(_disk_request("vs-disk-grown", path, vm_class=vm_class))
    )
    assert created.task is None  # grown within the call, under the building mark
    vm = vm_ref(instance, created.id)
    root = next(d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk))
    assert (root.backing.fileName, root.capacityInKB) == (path, 3 * 1024 * 1024)
    marks = {option.key: option.value for option in vm.config.extraConfig}
    assert not marks.get(BUILDING_KEY)
    ok(backend.lifecycle.delete(created.id))
