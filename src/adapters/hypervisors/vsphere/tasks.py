"""vSphere Tasks as self-describing task ids, answerable by any replica and after a restart.

The id is `vsphere-task:<task MoRef>:<VM MoRef>`: vCenter keeps the Task itself, so TaskStatus
is one property-collector read of its `info.state` and `info.error` (never `info` whole: pyVmomi
fails to read some tasks' info from the simulator). The VM goes last so that any VM id,
colons included, round-trips.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.errors import EXPECTED_FAILURES, is_missing
from pyrigaud.adapters.hypervisors.vsphere.inventory import retrieve
from pyrigaud.domain.tasks import TaskRef, id_parts, self_describing_id

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

TASK_MOREF = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")


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
    try:
        rows = retrieve(instance, [task], ("info.state", "info.error"))
    except EXPECTED_FAILURES as error:
        if is_missing(error):
            return None
        raise
    if not rows:
        return None
    return Progress(state=rows[0].get("info.state"), error=rows[0].get("info.error"))
