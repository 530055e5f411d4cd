"""TaskStatus: answered from the hypervisor alone, never blocking on the task."""

from __future__ import annotations

from returns.result import Failure, Success

from pyrigaud.application.ports import Clock, PowerControl, TaskTracker
from pyrigaud.domain.bounds import describe_value
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import ShutdownTask, TaskRef, TaskState


class TaskStatus:
    def __init__(self, power: PowerControl, tracker: TaskTracker, clock: Clock) -> None:
        self._power = power
        self._tracker = tracker
        self._clock = clock

    def __call__(self, task_id: str) -> TaskState:
        """Unknown, malformed or expired ids are done with an error naming them."""
        if not task_id:
            return TaskState.succeeded()  # an empty id means "completed synchronously"
        shutdown = ShutdownTask.parse(task_id)
        if shutdown is not None:
            return self._shutdown_state(shutdown)
        state = self._tracker.task_state(task_id)
        if state is None:
            return TaskState.failed(f"unknown task {describe_value(task_id)}")
        return state

    def _shutdown_state(self, task: ShutdownTask) -> TaskState:
        """Done once the VM is off; past the deadline, force the power-off (idempotently).

        The deadline that counts is the one recorded on the VM: when there is none, the
        shutdown this task started has already ended, and a VM started again since must not
        be switched off by an old task id.
        """
        match self._power.power_state(task.vm_id):
            case Failure(error) if error.kind is ErrorKind.NOT_FOUND:
                return TaskState.succeeded()
            case Failure(error):
                return TaskState(done=False, error=error.message)
            case Success(PowerState.OFF):
                self._power.clear_shutdown_deadline(task.vm_id)
                return TaskState.succeeded()
        match self._power.shutdown_deadline(task.vm_id):
            case Failure(error):
                return TaskState(done=False, error=error.message)
            case Success(None):
                return TaskState.succeeded()
            case Success(int() as deadline) if self._clock.now() < deadline:
                return TaskState.running()
        match self._power.power_off(task.vm_id):
            case Failure(error) if error.kind is not ErrorKind.NOT_FOUND:
                return TaskState(done=False, error=f"forcing power-off: {error.message}")
            case Success(TaskRef() as forcing):
                # The hypervisor's power-off task: done only once it is, so that Describe then
                # shows the VM off; until then the deadline stays and a later poll asks again.
                forced = self._tracker.task_state(forcing.id) or TaskState.running()
                if not forced.done or forced.error:
                    return TaskState(done=False, error=forced.error)
        match self._power.clear_shutdown_deadline(task.vm_id):
            case Failure(error) if error.kind is not ErrorKind.NOT_FOUND:
                return TaskState(done=False, error=f"forcing power-off: {error.message}")
        return TaskState.succeeded()
