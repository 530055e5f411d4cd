"""Making, changing and removing VMs."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict
from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CreateRequest, OwnerMark, VMChanges, VMRecord
from pyrigaud.domain.tasks import TaskRef


class CreatedVM(BaseModel):
    """The new VM's id, and the hypervisor's task still making it (None: made within the call).

    The id names the VM from the moment it is returned, whatever the task's outcome; once the
    task reports done the VM is complete, and once it reports an error there is no VM."""

    model_config = ConfigDict(frozen=True)

    id: str
    task: TaskRef | None = None


class VMLifecycle(Protocol):
    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        """The VM called `name`, with its ownership mark, or None."""
        ...

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        """Every VM whose Create has not finished (`building_since` set), whoever made it."""
        ...

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """Make the VM powered off: its id, and the task making it when not done in the call.

        A VM that is put together in several steps is marked as building (with this Create's
        start time) before anything else is made, and the mark is cleared only once it is
        complete, so a Create killed part-way leaves a VM that `find_unfinished` reports and
        `delete` removes whole. A VM made in one hypervisor task appears complete or not at all.

        The VM carries `owner`'s mark. A name already in use (whoever holds it) is
        ALREADY_EXISTS: whether that VM is ours to return is OwnershipRule's decision, not
        the adapter's. A failure part-way leaves nothing behind.
        """
        ...

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        """Remove the VM and its own disks; NOT_FOUND when it does not exist."""
        ...

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[TaskRef | None, ProviderError]:
        """Apply CPU, memory and disk growth, online where possible, else for the next boot.

        None when done within the call; else the hypervisor's own task doing it (one that any
        replica's TaskTracker answers). FAILED_PRECONDITION names what blocks a change the
        hypervisor can make neither way.
        """
        ...

    def upgrade_hardware(
        self, vm_id: str, target_version: int
    ) -> Result[TaskRef | None, ProviderError]:
        """Raise the VM's virtual hardware version (0: the newest the host supports); None
        when done within the call, else the hypervisor's task doing it."""
        ...
