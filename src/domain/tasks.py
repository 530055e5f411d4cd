"""Task references and the self-describing task ids any replica can answer from the hypervisor.

A task id must stay answerable after a restart and from any replica, so the provider keeps no
task table: either the operation completes synchronously (no task), or the id carries what is
needed to answer TaskStatus from the hypervisor alone.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class TaskRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str


class TaskState(BaseModel):
    """done=True with an error is a terminal failure; done=False means still running."""

    model_config = ConfigDict(frozen=True)

    done: bool
    error: str = ""

    @classmethod
    def running(cls) -> TaskState:
        return cls(done=False)

    @classmethod
    def succeeded(cls) -> TaskState:
        return cls(done=True)

    @classmethod
    def failed(cls, error: str) -> TaskState:
        return cls(done=True, error=error or "task failed")


def self_describing_id(prefix: str, detail: str, vm_id: str) -> TaskRef:
    """`<prefix>:<detail>:<vm-id>`: the VM id goes last so that any id, colons included,
    round-trips through `id_parts`."""
    return TaskRef(id=f"{prefix}:{detail}:{vm_id}")


def id_parts(task_id: str, prefix: str) -> tuple[str, str] | None:
    """The detail and VM id of a `self_describing_id` with `prefix`, or None."""
    found, _, rest = task_id.partition(":")
    detail, _, vm_id = rest.partition(":")
    if found != prefix or not detail or not vm_id:
        return None
    return detail, vm_id


class ShutdownTask(BaseModel):
    """A graceful shutdown in flight: `shutdown:<deadline-unix>:<vm-id>`.

    TaskStatus answers done once the VM is off, and forces the power-off once the deadline
    has passed, so no thread waits out the timeout. The deadline goes first so that any VM id,
    colons included, round-trips.
    """

    model_config = ConfigDict(frozen=True)

    PREFIX: ClassVar[str] = "shutdown"

    vm_id: str
    deadline: int

    def task_ref(self) -> TaskRef:
        return self_describing_id(self.PREFIX, str(self.deadline), self.vm_id)

    @classmethod
    def parse(cls, task_id: str) -> ShutdownTask | None:
        parts = id_parts(task_id, cls.PREFIX)
        if parts is None:
            return None
        deadline, vm_id = parts
        if not (deadline.isascii() and deadline.isdigit() and len(deadline) <= 12):
            return None
        return cls(vm_id=vm_id, deadline=int(deadline))
