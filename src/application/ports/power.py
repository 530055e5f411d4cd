"""Power control, including what a graceful shutdown in flight needs to survive a restart."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef


class PowerControl(Protocol):
    """power_on, power_off and reboot answer None when done within the call, else the
    hypervisor's own task doing it (one that any replica's TaskTracker answers)."""

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]: ...

    def power_on(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        """Bring an Off VM (shut off, paused, suspended, crashed) back to running."""
        ...

    def power_off(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        """Hard power-off."""
        ...

    def reboot(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        """Guest reboot where the guest can do it, else a reset."""
        ...

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        """Ask the guest to shut down (ACPI / guest agent) and record `deadline` on the VM.

        The deadline (unix seconds) lives on the VM itself so that any replica can see that
        a shutdown is already in flight and when to force it.
        """
        ...

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        """The deadline recorded by request_shutdown, or None when none is in flight."""
        ...

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]: ...
