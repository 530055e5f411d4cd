"""TaskTracker on the fake hypervisor."""

from __future__ import annotations

from pyrigaud.domain.tasks import TaskState


class FakeTaskTracker:
    def task_state(self, task_id: str) -> TaskState | None:
        """Every fake operation completes within its call: no id is one of the fake's tasks."""
        return None
