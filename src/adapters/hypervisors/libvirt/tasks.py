"""TaskTracker on libvirt: libvirt has no native tasks; every operation completes in its call."""

from __future__ import annotations

from pyrigaud.domain.tasks import TaskState


class LibvirtTasks:
    def task_state(self, task_id: str) -> TaskState | None:
        """No task of libvirt's ever outlives its call: none to answer."""
        return None
