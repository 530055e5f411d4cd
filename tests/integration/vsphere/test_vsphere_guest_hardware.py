"""A migrated guest's hardware on vSphere, on the vCenter simulator: Create around an imported
disk gives the guest the controller and NICs it had (or, from KVM, what it most likely has
drivers for, counted as a fallback), HardwareFacts reads a VM's hardware back and finds an
import's record, and Describe shows the device models in use."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from pyrigaud.adapters.hypervisors.vsphere.device_models import FallbackCounters
from pyrigaud.application.backend import Backend
from pyrigaud.application.guest_hardware import DEVICES_KEY
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.hardware import DiskController, Firmware, NicModel, VirtualHardware
from pyrigaud.domain.models import (
    CreateRequest,
    DiskSpec,
    NetworkAttachment,
    OwnerMark,
    SecurityProfile,
    VMClass,
    VMImage,
)

from contract.harness import made
from support import error_kind, ok
from support.image_server import raw_image
from support.ova import DATASTORE, write_datastore_file
from support.vsphere import Simulator, backend_over, remove_vms_made_since, vim, vm_ref

OWNER = OwnerMark(provider="tests/vsphere-guest-hardware")
NETWORK = NetworkAttachment(network_name="VM Network")
CONTROLLERS = {
    DiskController.PVSCSI: vim.vm.device.ParaVirtualSCSIController,
    DiskController.LSI_LOGIC_SAS: vim.vm.device.VirtualLsiLogicSASController,
    DiskController.LSI_LOGIC: vim.vm.device.VirtualLsiLogicController,
    DiskController.BUSLOGIC: vim.vm.device.VirtualBusLogicController,
    DiskController.SATA: vim.vm.device.VirtualAHCIController,
    DiskController.NVME: vim.vm.device.VirtualNVMEController,
    DiskController.IDE: vim.vm.device.VirtualIDEController,
}
NICS = {
    NicModel.VMXNET3: vim.vm.device.VirtualVmxnet3,
    NicModel.E1000: vim.vm.device.VirtualE1000,
    NicModel.E1000E: vim.vm.device.VirtualE1000e,
    NicModel.VMXNET2: vim.vm.device.VirtualVmxnet2,
    NicModel.PCNET: vim.vm.device.VirtualPCNet32,
}
# Each controller with a NIC model, so that every mapping is made once.
PAIRS = list(zip(CONTROLLERS, [*NICS, NicModel.VMXNET3, NicModel.E1000], strict=True))


class Counted:
    def __init__(self) -> None:
        self.counts = {"disk_controller": 0, "nic": 0}

    def counters(self) -> FallbackCounters:
        return FallbackCounters(
            disk_controller=lambda: self._count("disk_controller"),
            nic=lambda: self._count("nic"),
        )

    def _count(self, device: str) -> None:
        self.counts[device] += 1


@pytest.fixture
def fallbacks() -> Counted:
    return Counted()


@pytest.fixture
def backend(simulator: Simulator, fallbacks: Counted) -> Iterator[Backend]:
    """A replica's ports whose fallback counts the test reads; its VMs deleted after it."""
    ports = backend_over(simulator.session(), fallbacks=fallbacks.counters())
    before = {vm.id for vm in ports.inventory.list_vms().unwrap()}
    yield ports
    remove_vms_made_since(ports, before)


def _imported_disk(simulator: Simulator, instance: Any, name: str) -> str:
    path = f"[{DATASTORE}] {name}/{name}.vmdk"
    write_datastore_file(simulator, instance, path, raw_image(64 * 1024))
    write_datastore_file(simulator, instance, path.replace(".vmdk", "-flat.vmdk"), b"")
    return path


def _request(
    name: str, path: str, hardware: VirtualHardware | None, **changes: object
) -> CreateRequest:
    image = VMImage(path=path, format="vmdk", checksum_type="sha256")
    base = CreateRequest(
        name=name,
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=image,
        networks=(NETWORK, NETWORK),
        hardware=hardware,
    )
    return base.model_copy(update=changes)


def _disk_controller(vm: Any) -> Any:
    devices = vm.config.hardware.device
    disk = next(d for d in devices if isinstance(d, vim.vm.device.VirtualDisk))
    return next(d for d in devices if d.key == disk.controllerKey)


def _nic_classes(vm: Any) -> list[type]:
    return [
        type(d)
        for d in vm.config.hardware.device
        if isinstance(d, vim.vm.device.VirtualEthernetCard)
    ]


@pytest.mark.parametrize(("controller", "nic"), PAIRS, ids=[str(c) for c, _ in PAIRS])
def test_the_guest_gets_its_own_controller_and_nics(
    backend: Backend,
    simulator: Simulator,
    instance: Any,
    fallbacks: Counted,
    controller: DiskController,
    nic: NicModel,
) -> None:
    name = f"vs-hw-{controller}"
    hardware = VirtualHardware(
        source_hypervisor="vsphere",
        disk_controller=controller,
        nic_models=(nic, NicModel.VMXNET3),
    )
    vm_id = made(
        backend.tasks,
        backend.lifecycle.start_create(
            _request(name, _imported_disk(simulator, instance, name), hardware), OWNER
        ),
    )
    vm = vm_ref(instance, vm_id)
    assert isinstance(_disk_controller(vm), CONTROLLERS[controller])
    assert _nic_classes(vm) == [NICS[nic], vim.vm.device.VirtualVmxnet3]
    assert fallbacks.counts == {"disk_controller": 0, "nic": 0}

    raw = ok(backend.inventory.describe(vm_id))
    assert raw is not None
    assert raw.raw["disk_controller"] == str(controller)
    assert raw.raw["nic_models"] == f"{nic},vmxnet3"

    read = ok(backend.hardware.hardware_of(vm_id, "")) if backend.hardware else None
    assert read is not None
    assert (read.disk_controller, read.nic_models) == (controller, (nic, NicModel.VMXNET3))


def test_a_kvm_guest_gets_ide_and_e1000e_counted_and_said(
    backend: Backend,
    simulator: Simulator,
    instance: Any,
    fallbacks: Counted,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = "vs-hw-from-kvm"
    hardware = VirtualHardware(
        source_hypervisor="libvirt",
        disk_controller=DiskController.VIRTIO_BLK,
        nic_models=(NicModel.VIRTIO, NicModel.VIRTIO),
        machine_type="pc-q35-7.2",
    )
    request = _request(
        name, _imported_disk(simulator, instance, name), hardware, disks=(DiskSpec(size_gib=1),)
    )
    with caplog.at_level(logging.WARNING):
        vm_id = made(backend.tasks, backend.lifecycle.start_create(request, OWNER))
    vm = vm_ref(instance, vm_id)
    controller = _disk_controller(vm)
    assert isinstance(controller, vim.vm.device.VirtualIDEController)
    assert controller.key == 200  # the VM's own first IDE controller
    assert _nic_classes(vm) == [vim.vm.device.VirtualE1000e] * 2
    disks = [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk)]
    extra = next(d for d in vm.config.hardware.device if d.key == disks[1].controllerKey)
    assert isinstance(extra, vim.vm.device.VirtualLsiLogicController)  # the extra disk's
    assert fallbacks.counts == {"disk_controller": 1, "nic": 1}
    said = " ".join(record.getMessage() for record in caplog.records)
    assert "virtio-blk" in said
    assert "virtio" in said
    assert "e1000e" in said

    described = ok(backend.inventory.describe(vm_id))
    assert described is not None
    assert (described.raw["disk_controller"], described.raw["nic_models"]) == (
        "ide",
        "e1000e,e1000e",
    )


def test_without_hardware_the_devices_are_as_before(
    backend: Backend, simulator: Simulator, instance: Any, fallbacks: Counted
) -> None:
    name = "vs-hw-none"
    vm_id = made(
        backend.tasks,
        backend.lifecycle.start_create(
            _request(name, _imported_disk(simulator, instance, name), None), OWNER
        ),
    )
    vm = vm_ref(instance, vm_id)
    assert type(_disk_controller(vm)) is vim.vm.device.VirtualLsiLogicController
    assert _nic_classes(vm) == [vim.vm.device.VirtualVmxnet3] * 2
    assert fallbacks.counts == {"disk_controller": 0, "nic": 0}


def test_an_attachment_naming_its_model_keeps_it(
    backend: Backend, simulator: Simulator, instance: Any
) -> None:
    name = "vs-hw-named-model"
    hardware = VirtualHardware(source_hypervisor="vsphere", nic_models=(NicModel.E1000,))
    request = _request(
        name,
        _imported_disk(simulator, instance, name),
        hardware,
        networks=(NetworkAttachment(network_name="VM Network", model="vmxnet3"), NETWORK),
    )
    vm = vm_ref(instance, made(backend.tasks, backend.lifecycle.start_create(request, OWNER)))
    # The second NIC, beyond the guest's one, takes the guest's last model.
    assert _nic_classes(vm) == [vim.vm.device.VirtualVmxnet3, vim.vm.device.VirtualE1000]


def test_firmware_is_the_class_s_and_hardware_of_reads_it_back(
    backend: Backend, simulator: Simulator, instance: Any
) -> None:
    name = "vs-hw-uefi"
    vm_class = VMClass(
        cpu=1,
        memory_mib=256,
        firmware=Firmware.UEFI,
        security=SecurityProfile(secure_boot=True),
        extra_config={DEVICES_KEY: "guest", "pyrigaud.test": "kept"},
    )
    hardware = VirtualHardware(
        source_hypervisor="vsphere",
        firmware=Firmware.UEFI,
        secure_boot=True,
        disk_controller=DiskController.PVSCSI,
        nic_models=(NicModel.VMXNET3,),
    )
    request = _request(
        name,
        _imported_disk(simulator, instance, name),
        hardware,
        vm_class=vm_class,
        networks=(NETWORK,),
    )
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request, OWNER))
    vm = vm_ref(instance, vm_id)
    assert vm.config.firmware == "efi"
    assert vm.config.bootOptions.efiSecureBootEnabled is True
    extra = {option.key: option.value for option in vm.config.extraConfig}
    assert extra["pyrigaud.test"] == "kept"
    assert DEVICES_KEY not in extra  # the operator's choice is read by pyrigaud, not the VM's

    assert backend.hardware is not None
    assert ok(backend.hardware.hardware_of(vm_id, "")) == VirtualHardware(
        source_hypervisor="vsphere",
        firmware=Firmware.UEFI,
        secure_boot=True,
        disk_controller=DiskController.PVSCSI,
        nic_models=(NicModel.VMXNET3,),
        machine_type=str(vm.config.version),
        guest_os="otherLinux64Guest",
    )
    disk_key = next(
        str(d.key) for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk)
    )
    by_key = ok(backend.hardware.hardware_of(vm_id, disk_key))
    assert by_key.disk_controller is DiskController.PVSCSI
    assert error_kind(backend.hardware.hardware_of(vm_id, "9999")) is ErrorKind.NOT_FOUND
    assert error_kind(backend.hardware.hardware_of("vm-404040", "")) is ErrorKind.NOT_FOUND


def test_an_import_record_is_found_beside_its_disk(
    backend: Backend, simulator: Simulator, instance: Any
) -> None:
    assert backend.hardware is not None
    path = _imported_disk(simulator, instance, "vs-hw-record")
    assert ok(backend.hardware.import_record_of(path)) is None
    record = b'{"path": "' + path.encode() + b'"}'
    write_datastore_file(
        simulator, instance, f"[{DATASTORE}] vs-hw-record/vs-hw-record.pyrigaud-import.json", record
    )
    assert ok(backend.hardware.import_record_of(path)) == record
    assert ok(backend.hardware.import_record_of(f"[{DATASTORE}] loose.vmdk")) is None


def test_only_nics_made_on_a_fallback_are_counted(
    backend: Backend, simulator: Simulator, instance: Any, fallbacks: Counted
) -> None:
    """A KVM guest's virtio NICs count only where a NIC is made without a model of its own."""
    hardware = VirtualHardware(
        source_hypervisor="libvirt",
        disk_controller=DiskController.VIRTIO_SCSI,
        nic_models=(NicModel.VIRTIO, NicModel.VIRTIO),
    )
    named = NetworkAttachment(network_name="VM Network", model="vmxnet3")
    for name, networks in (("vs-hw-no-nics", ()), ("vs-hw-named-nic", (named,))):
        request = _request(
            name, _imported_disk(simulator, instance, name), hardware, networks=networks
        )
        made(backend.tasks, backend.lifecycle.start_create(request, OWNER))
    assert fallbacks.counts == {"disk_controller": 2, "nic": 0}
