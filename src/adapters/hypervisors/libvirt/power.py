"""PowerControl on libvirt: power state, on, off, reboot, and the graceful shutdown's deadline.

A graceful shutdown asks the guest and records its deadline in the domain's metadata, so a
repeated request and the forced power-off after the deadline work from any replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from returns.result import Result

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest, power_of
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.adapters.hypervisors.libvirt.metadata import VMMetadata
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.power import PowerState

T = TypeVar("T")


class LibvirtPowerControl:
    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]:
        return self._host.run(
            f"read power state of {vm_id!r}",
            _with_guest(vm_id, _power_state),
        )

    def power_on(self, vm_id: str) -> Result[None, ProviderError]:
        return self._host.mutate(vm_id, f"power on {vm_id!r}", _with_guest(vm_id, Guest.start))

    def power_off(self, vm_id: str) -> Result[None, ProviderError]:
        return self._host.mutate(vm_id, f"power off {vm_id!r}", _with_guest(vm_id, Guest.stop))

    def reboot(self, vm_id: str) -> Result[None, ProviderError]:
        return self._host.mutate(vm_id, f"reboot {vm_id!r}", _with_guest(vm_id, Guest.reboot))

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        clock = self._host.clock

        def request(guest: Guest) -> Result[None, ProviderError]:
            def asked(metadata: VMMetadata) -> None:
                # The deadline first: once asked, a guest may be gone within the second, and any
                # replica's TaskStatus needs the deadline from the moment the request is out.
                guest.write_metadata(metadata.with_shutdown_deadline(deadline))
                guest.ask_to_shut_down(clock)

            return guest.own_metadata().map(asked)

        def shut_down(conn: VirConnect) -> Result[None, ProviderError]:
            return Guest.by_id(conn, vm_id).bind(request)

        return self._host.mutate(vm_id, f"shut down {vm_id!r}", shut_down)

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        def deadline(guest: Guest) -> int | None:
            metadata = guest.metadata()
            return metadata.shutdown_deadline if metadata else None

        return self._host.run(
            f"read shutdown deadline of {vm_id!r}",
            _with_guest(vm_id, deadline),
        )

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:
        def clear(guest: Guest) -> None:
            metadata = guest.facts().metadata
            if metadata is not None and metadata.shutdown_deadline is not None:
                guest.write_metadata(metadata.with_shutdown_deadline(None))

        return self._host.mutate(
            vm_id,
            f"clear shutdown deadline of {vm_id!r}",
            _with_guest(vm_id, clear),
        )


def _with_guest(
    vm_id: str, act: Callable[[Guest], T]
) -> Callable[[VirConnect], Result[T, ProviderError]]:
    """The action on a connection that finds the VM `vm_id` (NOT_FOUND when there is none)
    and answers what `act` makes of it."""

    def action(conn: VirConnect) -> Result[T, ProviderError]:
        return Guest.by_id(conn, vm_id).map(act)

    return action


def _power_state(guest: Guest) -> PowerState:
    return power_of(guest.state())
