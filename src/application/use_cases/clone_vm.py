"""Clone: a new VM from an existing one, idempotent by target name like Create."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ports import CapabilitySource, Cloning
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.application.use_cases.capabilities import require
from pyrigaud.application.use_cases.create_vm import NewVMNames
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest, OwnerMark


class CloneVM:
    def __init__(
        self,
        cloning: Cloning,
        capabilities: CapabilitySource,
        owner: OwnerMark,
        names: KeyedLock,
        existing: NewVMNames,
    ) -> None:
        self._cloning = cloning
        self._existing = existing
        self._capabilities = capabilities
        self._owner = owner
        self._names = names

    def __call__(self, request: CloneRequest) -> Result[CreatedVM, ProviderError]:
        capabilities = self._capabilities.capabilities()
        gate = require(capabilities.supports_clone, "cloning")
        if request.linked:
            gate = gate.bind(
                lambda _: require(capabilities.supports_linked_clones, "linked clones")
            )
        return gate.bind(lambda _: self._clone(request))

    def _clone(self, request: CloneRequest) -> Result[CreatedVM, ProviderError]:
        with self._names.hold(request.target_name):
            match self._existing.resolve(request.target_name):
                case Failure(error):
                    return Failure(error)
                case Success(CreatedVM() as found):
                    return Success(found)
            return self._cloning.start_clone(request, self._owner)
