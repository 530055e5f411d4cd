"""PowerControl on the fake hypervisor: every change is done within the call (no task)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from returns.result import Result

from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor, FakeVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.power import PowerState


@dataclass(frozen=True)
class FakePowerControl:
    hypervisor: FakeHypervisor

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]:
        def state(vm: FakeVM) -> PowerState:
            return PowerState.ON if self.hypervisor.running(vm) else PowerState.OFF

        def read() -> Result[PowerState, ProviderError]:
            return self.hypervisor.vm(vm_id).map(state)

        return self.hypervisor.serve("power_state", read)

    def power_on(self, vm_id: str) -> Result[None, ProviderError]:
        return self._change("power_on", vm_id, self.hypervisor.start)

    def power_off(self, vm_id: str) -> Result[None, ProviderError]:
        return self._change("power_off", vm_id, self.hypervisor.stop)

    def reboot(self, vm_id: str) -> Result[None, ProviderError]:
        def reboot(vm: FakeVM) -> None:
            self.hypervisor.stop(vm)
            self.hypervisor.start(vm)

        return self._change("reboot", vm_id, reboot)

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        def request(vm: FakeVM) -> None:
            if self.hypervisor.running(vm) and self.hypervisor.guest_honors_shutdown:
                vm.shutdown_requested_at = self.hypervisor.clock.now()
            vm.shutdown_deadline = deadline

        return self._change("request_shutdown", vm_id, request)

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        def read() -> Result[int | None, ProviderError]:
            return self.hypervisor.vm(vm_id).map(attrgetter("shutdown_deadline"))

        return self.hypervisor.serve("shutdown_deadline", read)

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:
        def clear(vm: FakeVM) -> None:
            vm.shutdown_deadline = None

        return self._change("clear_shutdown_deadline", vm_id, clear)

    def _change(
        self, operation: str, vm_id: str, change: Callable[[FakeVM], None]
    ) -> Result[None, ProviderError]:
        def changed() -> Result[None, ProviderError]:
            return self.hypervisor.vm(vm_id).map(change)

        return self.hypervisor.serve(operation, changed)
