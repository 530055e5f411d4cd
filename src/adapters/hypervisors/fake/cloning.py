"""Cloning on the fake hypervisor: full copies, or overlays on the source's disks."""

from __future__ import annotations

from dataclasses import dataclass

from returns.result import Result

from pyrigaud.adapters.hypervisors.fake.hypervisor import (
    DISK_DIR,
    FakeDisk,
    FakeHypervisor,
    FakeNic,
    FakeVM,
)
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest, OwnerMark


@dataclass(frozen=True)
class FakeCloning:
    hypervisor: FakeHypervisor

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """Made within the call: no task. A name in use is ALREADY_EXISTS, whoever holds it."""

        def clone() -> Result[CreatedVM, ProviderError]:
            return Result.do(
                CreatedVM(id=self._clone(source, request, owner))
                for source in self.hypervisor.vm(request.source_vm_id)
                for _ in self.hypervisor.require_free_name(request.target_name)
            )

        return self.hypervisor.serve("clone", clone)

    def _clone(self, source: FakeVM, request: CloneRequest, owner: OwnerMark) -> str:
        disks = [
            FakeDisk(
                id=f"disk{index}",
                path=f"{DISK_DIR}/{request.target_name}-disk{index}.qcow2",
                size_gib=disk.size_gib,
                format="qcow2",
                backing_file=disk.path if request.linked else "",
            )
            for index, disk in enumerate(source.disks)
        ]
        customization = request.customization
        nics = (
            [self.hypervisor.nic(attachment) for attachment in customization.networks]
            if customization and customization.networks
            else [FakeNic(name=nic.name, mac=self.hypervisor.mac()) for nic in source.nics]
        )
        vm = self.hypervisor.new_vm(
            request.target_name,
            owner,
            cpu=request.cpu or source.cpu,
            memory_mib=request.memory_mib or source.memory_mib,
            disks=disks,
            nics=nics,
        )
        vm.firmware, vm.hardware_version = source.firmware, source.hardware_version
        vm.cpu_hot_add, vm.memory_hot_add = source.cpu_hot_add, source.memory_hot_add
        vm.hostname = customization.hostname if customization else ""
        return vm.id
