"""VMLifecycle on the fake hypervisor: making, changing and removing VMs within the call."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.fake.hypervisor import (
    DISK_DIR,
    FakeDisk,
    FakeHypervisor,
    FakeVM,
    no_templates,
    not_on_this_host,
)
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain import fields
from pyrigaud.domain.bounds import DEFAULT_ROOT_DISK_GIB
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import VirtualHardware
from pyrigaud.domain.models import CreateRequest, OwnerMark, VMChanges, VMRecord

LATEST_HARDWARE_VERSION = 21


@dataclass(frozen=True)
class FakeVMLifecycle:
    hypervisor: FakeHypervisor

    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        def find() -> Result[VMRecord | None, ProviderError]:
            vm_id = self.hypervisor.ids_by_name.get(name)
            return Success(None if vm_id is None else _record(self.hypervisor.vms[vm_id]))

        return self.hypervisor.serve("find_by_name", find)

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        def unfinished() -> Result[list[VMRecord], ProviderError]:
            vms = self.hypervisor.vms.values()
            return Success([_record(vm) for vm in vms if vm.building_since is not None])

        return self.hypervisor.serve("find_unfinished", unfinished)

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """Made within the call: no task. A name in use is ALREADY_EXISTS, whoever holds it."""

        def create() -> Result[CreatedVM, ProviderError]:
            return Result.do(
                CreatedVM(id=self._create(request, owner, root_disk))
                for _ in self.hypervisor.require_free_name(request.name)
                for root_disk in self._placed_root_disk(request)
            )

        return self.hypervisor.serve("create", create)

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        def delete(vm: FakeVM) -> None:
            del self.hypervisor.vms[vm.id]
            del self.hypervisor.ids_by_name[vm.name]

        def deleted() -> Result[None, ProviderError]:
            return self.hypervisor.vm(vm_id).map(delete)

        return self.hypervisor.serve("delete", deleted)

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[None, ProviderError]:
        def reconfigured() -> Result[None, ProviderError]:
            return self.hypervisor.vm(vm_id).map(partial(self._reconfigure, changes=changes))

        return self.hypervisor.serve("reconfigure", reconfigured)

    def upgrade_hardware(self, vm_id: str, target_version: int) -> Result[None, ProviderError]:
        def upgraded() -> Result[None, ProviderError]:
            return self.hypervisor.vm(vm_id).bind(
                partial(self._upgrade_hardware, target_version=target_version)
            )

        return self.hypervisor.serve("upgrade_hardware", upgraded)

    def _placed_root_disk(self, request: CreateRequest) -> Result[FakeDisk, ProviderError]:
        """The new VM's root disk, once its datastore is one the host has."""
        datastore = request.placement.datastore or self.hypervisor.datastores[0]
        if datastore not in self.hypervisor.datastores:
            return Failure(
                ProviderError.invalid_spec(
                    fields.PLACEMENT_DATASTORE, f"no datastore named {datastore!r}"
                )
            )
        return self._root_disk(request)

    def _create(self, request: CreateRequest, owner: OwnerMark, root_disk: FakeDisk) -> str:
        disks = [root_disk] + [
            _blank_disk(request.name, index, spec.size_gib)
            for index, spec in enumerate(request.disks, start=1)
        ]
        vm = self.hypervisor.new_vm(
            request.name,
            owner,
            cpu=request.vm_class.cpu,
            memory_mib=request.vm_class.memory_mib,
            disks=disks,
            nics=[self.hypervisor.nic(attachment) for attachment in request.networks],
        )
        vm.cpu_hot_add = request.vm_class.performance.cpu_hot_add
        vm.memory_hot_add = request.vm_class.performance.memory_hot_add
        vm.firmware = request.vm_class.firmware.value
        vm.secure_boot = request.vm_class.security.secure_boot
        if request.hardware is not None:
            _given_hardware(vm, request.hardware)
        vm.tags = request.tags
        return vm.id

    def _root_disk(self, request: CreateRequest) -> Result[FakeDisk, ProviderError]:
        image = request.image
        wanted = request.vm_class.disk_defaults.size_gib
        path = f"{DISK_DIR}/{request.name}-disk0.qcow2"
        if image.is_blank:
            return Success(
                FakeDisk(id="disk0", path=path, size_gib=wanted or DEFAULT_ROOT_DISK_GIB)
            )
        if image.template_name:
            return no_templates(fields.IMAGE_TEMPLATE_NAME)
        if image.path:
            base = self.hypervisor.images.get(image.path)
            if base is None:
                return not_on_this_host(fields.IMAGE_PATH, image.path)
            size = max(wanted, base.size_gib)
            return Success(FakeDisk(id="disk0", path=path, size_gib=size, backing_file=base.path))
        if not image.url.startswith(("http://", "https://")):
            return Failure(ProviderError.invalid_spec(fields.IMAGE_URL, "must be an http(s) URL"))
        return Success(FakeDisk(id="disk0", path=path, size_gib=wanted or DEFAULT_ROOT_DISK_GIB))

    def _reconfigure(self, vm: FakeVM, changes: VMChanges) -> None:
        running = self.hypervisor.running(vm)
        if changes.cpu is not None:
            vm.pending_restart |= running and not vm.cpu_hot_add
            vm.cpu = changes.cpu
        if changes.memory_mib is not None:
            vm.pending_restart |= running and not vm.memory_hot_add
            vm.memory_mib = changes.memory_mib
        if changes.root_disk_gib is not None and vm.disks:
            vm.disks[0].size_gib = max(vm.disks[0].size_gib, changes.root_disk_gib)
        for position, spec in enumerate(changes.disks, start=1):
            if position < len(vm.disks):
                vm.disks[position].size_gib = max(vm.disks[position].size_gib, spec.size_gib)
            elif spec.size_gib:
                vm.disks.append(_blank_disk(vm.name, position, spec.size_gib))

    def _upgrade_hardware(self, vm: FakeVM, target_version: int) -> Result[None, ProviderError]:
        target = target_version or LATEST_HARDWARE_VERSION
        if self.hypervisor.running(vm):
            return _precondition("power the VM off to upgrade its hardware")
        if target > LATEST_HARDWARE_VERSION:
            return _precondition(
                f"the host supports hardware versions up to {LATEST_HARDWARE_VERSION}"
            )
        if target < vm.hardware_version:
            return _precondition(
                f"hardware version {vm.hardware_version} cannot go down to {target}"
            )
        vm.hardware_version = target
        return Success(None)


def _given_hardware(vm: FakeVM, hardware: VirtualHardware) -> None:
    """The guest's devices as Create was told them: the fake has every model; NICs beyond
    the guest's take its last one's."""
    vm.disk_controller = hardware.disk_controller
    for index, nic in enumerate(vm.nics):
        if hardware.nic_models:
            nic.model = hardware.nic_models[min(index, len(hardware.nic_models) - 1)]


def _record(vm: FakeVM) -> VMRecord:
    return VMRecord(id=vm.id, name=vm.name, owner=vm.owner, building_since=vm.building_since)


def _blank_disk(vm_name: str, index: int, size_gib: int) -> FakeDisk:
    return FakeDisk(
        id=f"disk{index}", path=f"{DISK_DIR}/{vm_name}-disk{index}.qcow2", size_gib=size_gib
    )


def _precondition(message: str) -> Failure[ProviderError]:
    return Failure(ProviderError.failed_precondition(message))
