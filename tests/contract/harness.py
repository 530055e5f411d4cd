"""What the contract suite needs of a backend besides its adapter."""

from __future__ import annotations

from dataclasses import dataclass

from pyrigaud.adapters.clocks import ManualClock
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.domain.models import CreateRequest, VMClass, VMImage


@dataclass
class Harness:
    adapter: FakeHypervisor
    clock: ManualClock
    image: VMImage  # an image that exists on the backend, for "create from an image"

    def request(self, name: str, **changes: object) -> CreateRequest:
        base = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256))
        return base.model_copy(update=changes)
