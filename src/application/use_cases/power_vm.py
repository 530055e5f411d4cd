"""Power: idempotent transitions, and graceful shutdown as a self-describing task."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.application.ports import Clock, PowerControl
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.power import DEFAULT_GRACEFUL_TIMEOUT_SECONDS, PowerOp, PowerState
from pyrigaud.domain.tasks import ShutdownTask, TaskRef

# A recorded shutdown deadline further in the past than this is left over from an earlier
# power cycle (the VM was started again behind our back), not a shutdown still in flight.
STALE_SHUTDOWN_SECONDS = 300


class PowerVM:
    def __init__(self, power: PowerControl, clock: Clock) -> None:
        self._power = power
        self._clock = clock

    def __call__(
        self, vm_id: str, op: PowerOp, graceful_timeout_seconds: int
    ) -> Result[TaskRef | None, ProviderError]:
        """None means done; a TaskRef means the change is under way: a graceful shutdown in
        flight, or the hypervisor's own task for ON, OFF and REBOOT.

        A recorded shutdown deadline is cleared before ON and OFF start rather than after they
        end, so no second change of the VM has to wait on (or race) the power task.
        """
        match self._power.power_state(vm_id):
            case Failure() as failed:
                return failed
            case Success(state):
                pass
        match op:
            case PowerOp.ON:
                if state is PowerState.ON:
                    return Success(None)
                return Result.do(
                    answer
                    for _ in self._power.clear_shutdown_deadline(vm_id)
                    for answer in self._power.power_on(vm_id)
                )
            case PowerOp.OFF:
                if state is PowerState.OFF:
                    return Success(None)
                return self._force_off(vm_id)
            case PowerOp.REBOOT:
                if state is PowerState.OFF:
                    return Failure(
                        ProviderError.failed_precondition(
                            f"VM {vm_id!r} is off; power it on instead of rebooting it"
                        )
                    )
                return self._power.reboot(vm_id)
            case PowerOp.SHUTDOWN_GRACEFUL:
                if state is PowerState.OFF:
                    return Success(None)
                return self._shutdown(vm_id, graceful_timeout_seconds)

    def _force_off(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return Result.do(
            answer
            for _ in self._power.clear_shutdown_deadline(vm_id)
            for answer in self._power.power_off(vm_id)
        )

    def _shutdown(self, vm_id: str, timeout: int) -> Result[TaskRef | None, ProviderError]:
        """Repeated requests (the manager sends one every 5 s) return the task in flight."""
        now = int(self._clock.now())
        match self._power.shutdown_deadline(vm_id):
            case Failure() as failed:
                return failed
            case Success(int() as deadline) if deadline > now:
                return Success(ShutdownTask(vm_id=vm_id, deadline=deadline).task_ref())
            case Success(int() as deadline) if now - deadline <= STALE_SHUTDOWN_SECONDS:
                # The guest ignored the request and the timeout has passed: fall back.
                return self._force_off(vm_id)
        deadline = now + (timeout or DEFAULT_GRACEFUL_TIMEOUT_SECONDS)
        return Result.do(
            ShutdownTask(vm_id=vm_id, deadline=deadline).task_ref()
            for _ in self._power.request_shutdown(vm_id, deadline)
        )
