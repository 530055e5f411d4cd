"""vSphere Tasks as self-describing task ids, answerable by any replica and after a restart.

The id is `vsphere-task:<task MoRef>:<VM MoRef>`: vCenter keeps the Task itself, so TaskStatus
is one property-collector read of its `info.state` and `info.error` (never `info` whole: pyVmomi
fails to read some tasks' info from the simulator). The VM goes last so that any VM id,
colons included, round-trips.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import or_none, run
from pyrigaud.adapters.hypervisors.vsphere.errors import (
    fault_message,
)
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve
from pyrigaud.adapters.hypervisors.vsphere.session import Connection, VSphereSession
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.tasks import TaskRef, TaskState, id_parts, self_describing_id

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

TASK_MOREF = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
TASK_DEADLINE_SECONDS = 240.0


@dataclass(frozen=True)
class VSphereTask:
    PREFIX: ClassVar[str] = "vsphere-task"

    task: str  # the Task's MoRef value, e.g. task-42
    vm_id: str

    def task_ref(self) -> TaskRef:
        return self_describing_id(self.PREFIX, self.task, self.vm_id)

    @classmethod
    def parse(cls, task_id: str) -> VSphereTask | None:
        parts = id_parts(task_id, cls.PREFIX)
        if parts is None or not TASK_MOREF.fullmatch(parts[0]):
            return None
        return cls(task=parts[0], vm_id=parts[1])


@dataclass(frozen=True)
class Progress:
    state: Any  # a vim.TaskInfo.State value
    error: Any = None  # the fault, once the task failed

    @property
    def succeeded(self) -> bool:
        return bool(self.state == vim.TaskInfo.State.success)

    @property
    def failed(self) -> bool:
        return bool(self.state == vim.TaskInfo.State.error)


def progress(instance: Any, task: Any) -> Progress | None:
    """Where the task stands (one round trip); None once vCenter no longer knows it."""
    rows = or_none(partial(retrieve, instance, [task], ("info.state", "info.error")))
    if not rows:
        return None
    return Progress(state=rows[0].get("info.state"), error=rows[0].get("info.error"))


def wait(connection: Connection, task: Any) -> Result[Any, ProviderError]:
    """The task's result once it ends, reading only info.state/error/result, polling by the
    connection's clock (bounded wait). A task that failed with a fault raises it, as the
    call would have had it been synchronous: the caller may expect it (FileNotFound), and
    the edge maps it with what the caller was doing."""
    clock = connection.clock
    deadline = clock.now() + TASK_DEADLINE_SECONDS
    delay = 0.05
    while True:
        found = progress(connection, task)
        if found is None:
            return Failure(ProviderError.unavailable(f"vSphere task {task._moId} vanished"))
        if found.succeeded:
            return Success(retrieve(connection, [task], ("info.result",))[0].get("info.result"))
        if found.failed:
            if isinstance(found.error, BaseException):
                raise found.error
            return Failure(ProviderError.failed_precondition(fault_message(found.error)))
        if clock.now() > deadline:
            return Failure(ProviderError.unavailable("vSphere task did not finish in time"))
        clock.sleep(delay)
        delay = min(delay * 2, 2.0)


def ended(connection: Connection, task: Any) -> Result[None, ProviderError]:
    """`wait` for a task whose result is not wanted."""
    return wait(connection, task).map(_ignored)


def destroyed(connection: Connection, vm: Any) -> Result[Any, ProviderError]:
    """`vm` destroyed, its task waited for."""
    return wait(connection, vm.Destroy_Task())


def _ignored(_result: Any) -> None:
    return None


@dataclass(frozen=True)
class TaskOperation:
    """An operation that is one vSphere Task: `start` returns it (None: nothing to do)."""

    doing: str  # for error messages: "reconfiguring VM 'vm-42'"
    vm_id: str
    start: Callable[[Any], Result[Any, ProviderError]]


def begin(
    session: VSphereSession, operation: TaskOperation
) -> Result[TaskRef | None, ProviderError]:
    """Start the operation's Task and hand back its id at once; None when no Task was needed
    (already in the state asked for, or a guest reboot)."""

    def task_ref(task: Any) -> TaskRef | None:
        if task is None:
            return None
        return VSphereTask(task=str(task._moId), vm_id=operation.vm_id).task_ref()

    def start(instance: Any) -> Result[TaskRef | None, ProviderError]:
        return operation.start(instance).map(task_ref)

    return run(session, operation.doing, start)


class VSphereTaskTracker:
    """TaskStatus for `vsphere-task:` ids, from vCenter alone; `on_ended` is told the VM of a
    task reported done, before TaskStatus answers (the inventory cache re-reads it)."""

    def __init__(self, session: VSphereSession, on_ended: Callable[[str], None] = _ignored) -> None:
        self._session = session
        self._on_ended = on_ended

    def task_state(self, task_id: str) -> TaskState | None:
        """A `vsphere-task:` id's state in one round trip; an unreadable one is still running
        with the reason as its error (the caller asks again)."""
        task = VSphereTask.parse(task_id)
        if task is None:
            return None

        def read(instance: Any) -> Result[TaskState, ProviderError]:
            return Success(_state(task, progress(instance, vim.Task(task.task, instance._stub))))

        match run(self._session, f"reading vSphere task {task.task!r}", read):
            case Success(TaskState() as answered):
                state = answered
                if state.done:
                    self._on_ended(task.vm_id)
            case Failure(error):
                state = TaskState(done=False, error=str(error))
        return state


def _state(task: VSphereTask, found: Progress | None) -> TaskState:
    if found is None:
        return TaskState.failed(
            f"vSphere task {task.task!r} (VM {task.vm_id!r}) is unknown or expired; "
            "vCenter keeps finished tasks for a limited time only"
        )
    if found.succeeded:
        return TaskState.succeeded()
    if found.failed:
        return TaskState.failed(fault_message(found.error))
    return TaskState.running()
