"""Hypervisor-native tasks (e.g. vSphere Task MoRefs) that any replica can look up."""

from __future__ import annotations

from typing import Protocol

from pyrigaud.domain.tasks import TaskState


class TaskTracker(Protocol):
    def task_state(self, task_id: str) -> TaskState | None:
        """The task's state from the hypervisor without blocking; None when the id is not one
        of this backend's tasks (the caller then answers done with an error)."""
        ...
