"""The one ownership rule: what a VM-making request (Create, Clone) does with a name in use.

Adapters only report what they find under a name (the owner mark, the building mark and its
start time) and fail with ALREADY_EXISTS when the hypervisor refuses a duplicate name; whether
that VM is ours to return, someone else's, or a half-built one to wait for or sweep is decided
here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable

from returns.result import Failure, Result, Success

from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ports import Clock, VMLifecycle
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import OwnerMark, VMRecord

# How long a Create waits for another replica's Create of the same name to finish.
WAIT_FOR_OTHER_CREATE_SECONDS = 120.0
POLL_SECONDS = 1.0


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


class OwnershipRule:
    """Create and Clone share these rules.

    Within one process, requests for one name take turns (a lock per name). A same-named VM of
    ours that is still building is either another replica's request in progress (wait for it,
    then return it) or a crash leftover (remove it, then make anew). Across replicas the
    hypervisor arbitrates: a duplicate name fails there, and the VM that won is looked at again.
    """

    def __init__(
        self,
        lifecycle: VMLifecycle,
        owner: OwnerMark,
        clock: Clock,
        leftovers: LeftoverPolicy,
        name_locks: KeyedLock,
    ) -> None:
        self._lifecycle = lifecycle
        self._owner = owner
        self._clock = clock
        self._leftovers = leftovers
        self._name_locks = name_locks

    def make_unless_exists(
        self, name: str, make: Callable[[OwnerMark], Result[CreatedVM, ProviderError]]
    ) -> Result[CreatedVM, ProviderError]:
        """The VM of ours already under `name`, else the one `make(owner)` starts."""
        with self._name_locks.hold(name):
            match self.existing_vm(name):
                case Failure() as failed:
                    return failed
                case Success(CreatedVM() as found):
                    return Success(found)
            made = make(self._owner)
            match made:
                case Failure(ProviderError(kind=ErrorKind.ALREADY_EXISTS)):
                    # Another replica made a VM of that name since we looked: ours to return
                    # only by the same rule; when no VM holds the name, the failure stands.
                    match self.existing_vm(name):
                        case Success(CreatedVM() as raced):
                            return Success(raced)
                        case Failure(ProviderError(kind=ErrorKind.ALREADY_EXISTS)) as foreign:
                            return foreign
            return made

    def existing_vm(self, name: str) -> Result[CreatedVM | None, ProviderError]:
        """The existing VM to return, or None when the name is free to make a VM under."""
        give_up_at = self._clock.now() + WAIT_FOR_OTHER_CREATE_SECONDS
        while True:
            match self._lifecycle.find_by_name(name):
                case Failure(ProviderError(kind=ErrorKind.NOT_FOUND)) as vanished:
                    # The VM of that name went between finding and reading it (a racing
                    # replica removed its losing copy): look again.
                    if self._clock.now() >= give_up_at:
                        return vanished
                    self._clock.sleep(POLL_SECONDS)
                    continue
                case Failure() as failed:
                    return failed
                case Success(None):
                    return Success(None)
                case Success(VMRecord() as existing):
                    pass
            if not self._leftovers.is_ours_unfinished(existing):
                return adopt_existing(existing, self._owner)
            if self._leftovers.is_abandoned(existing, self._clock.now()):
                return Result.do(None for _ in self._lifecycle.delete(existing.id))
            if self._clock.now() >= give_up_at:
                return Failure(
                    ProviderError.unavailable(
                        f"VM {name!r} (id {existing.id!r}) is still being created by another "
                        "request; retry shortly"
                    )
                )
            self._clock.sleep(POLL_SECONDS)
