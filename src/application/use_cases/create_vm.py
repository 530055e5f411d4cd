"""Create: idempotent by name for VMs this provider owns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from returns.result import Failure, Result, Success

from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ports import VMLifecycle
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CreateRequest, OwnerMark, VMRecord
from pyrigaud.domain.tasks import TaskRef


class CreatedVM(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    task: TaskRef | None = None


def adopt_existing(record: VMRecord, owner: OwnerMark) -> Result[CreatedVM, ProviderError]:
    """An existing VM of the requested name is ours to return only if it carries our mark."""
    if record.owner == owner:
        return Success(CreatedVM(id=record.id))
    whose = "another provider" if record.owner else "no pyrigaud provider"
    return Failure(
        ProviderError.already_exists(
            f"a VM named {record.name!r} already exists (id {record.id!r}) and was made by "
            f"{whose}; pick another name or delete that VM"
        )
    )


class CreateVM:
    def __init__(self, lifecycle: VMLifecycle, owner: OwnerMark, names: KeyedLock) -> None:
        self._lifecycle = lifecycle
        self._owner = owner
        self._names = names

    def __call__(self, request: CreateRequest) -> Result[CreatedVM, ProviderError]:
        """Differences between the request and an existing VM are Reconfigure's job, not ours."""
        with self._names.hold(request.name):
            match self._lifecycle.find_by_name(request.name):
                case Failure(error):
                    return Failure(error)
                case Success(VMRecord() as existing):
                    return adopt_existing(existing, self._owner)
            return self._lifecycle.create(request, self._owner).map(
                lambda vm_id: CreatedVM(id=vm_id)
            )
