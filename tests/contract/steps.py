"""Steps the per-port contract suites share."""

from __future__ import annotations

from returns.result import Result

from pyrigaud.application.ports import DiskTransfer
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import OwnerMark
from pyrigaud.domain.tasks import TaskRef, TaskState

from contract.harness import Harness, made
from support import ok

MISSING_IDS = ["", "no-such-vm", "00000000-0000-0000-0000-000000000000", "../../etc", "\x00x"]


def create(harness: Harness, owner: OwnerMark, name: str, **changes: object) -> str:
    """A new VM made through the port (the name must be free), once its task has succeeded."""
    started = harness.backend.lifecycle.start_create(harness.request(name, **changes), owner)
    return made(harness.backend.tasks, started)


def finished(harness: Harness, result: Result[TaskRef | None, ProviderError]) -> None:
    """A change is done within the call (None) or hands back a task that the backend's own
    tracker answers; every backend here has finished it by then (the vSphere simulator ends
    each Task before its call returns), so the task must already read done."""
    task = ok(result)
    if task is not None:
        assert harness.backend.tasks.task_state(task.id) == TaskState.succeeded()


def disks(harness: Harness) -> DiskTransfer:
    """The disk port, where a suite reads disk facts (GetDiskInfo) to check its own port."""
    assert harness.backend.disk_transfer is not None, "this check reads disks through GetDiskInfo"
    return harness.backend.disk_transfer
