"""HardwareFacts on the fake hypervisor: a VM's hardware as its Create was told it (else
virtio throughout), and the records its imports keep by disk name."""

from __future__ import annotations

from returns.result import Result, Success

from pyrigaud.adapters.hypervisors.fake.disk_transfer import DISK_SUFFIX, disk_of
from pyrigaud.adapters.hypervisors.fake.hypervisor import DISK_DIR, FakeDisk, FakeHypervisor, FakeVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import Firmware, VirtualHardware

SOURCE_HYPERVISOR = "fake"


class FakeHardwareFacts:
    def __init__(self, hypervisor: FakeHypervisor) -> None:
        self.hypervisor = hypervisor

    def hardware_of(self, vm_id: str, disk_id: str) -> Result[VirtualHardware, ProviderError]:
        """NOT_FOUND for no such VM or disk, as ExportDisk answers."""

        def hardware_with_disk(vm: FakeVM) -> Result[VirtualHardware, ProviderError]:
            def hardware(_disk: FakeDisk) -> VirtualHardware:
                return _hardware(vm)

            return disk_of(vm, disk_id, "").map(hardware)

        def read() -> Result[VirtualHardware, ProviderError]:
            return self.hypervisor.vm(vm_id).bind(hardware_with_disk)

        return self.hypervisor.serve("hardware_of", read)

    def import_record_of(self, disk_path: str) -> Result[bytes | None, ProviderError]:
        name = disk_path.removeprefix(f"{DISK_DIR}/").removesuffix(DISK_SUFFIX)
        landed = f"{DISK_DIR}/{name}{DISK_SUFFIX}" == disk_path and "/" not in name

        def record() -> Result[bytes | None, ProviderError]:
            return Success(self.hypervisor.import_records.get(name) if landed else None)

        return self.hypervisor.serve("import_record_of", record)


def _hardware(vm: FakeVM) -> VirtualHardware:
    return VirtualHardware(
        source_hypervisor=SOURCE_HYPERVISOR,
        firmware=Firmware(vm.firmware),
        secure_boot=vm.secure_boot,
        disk_controller=vm.disk_controller,
        nic_models=tuple(nic.model for nic in vm.nics),
        machine_type=f"fake-{vm.hardware_version}",
    )
