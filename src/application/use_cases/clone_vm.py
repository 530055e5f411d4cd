"""Clone: a new VM from an existing one, idempotent by target name like Create."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ports import CapabilitySource, Cloning, VMLifecycle
from pyrigaud.application.use_cases.capabilities import require
from pyrigaud.application.use_cases.create_vm import CreatedVM, adopt_existing
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest, OwnerMark, VMRecord


class CloneVM:
    def __init__(
        self,
        cloning: Cloning,
        lifecycle: VMLifecycle,
        capabilities: CapabilitySource,
        owner: OwnerMark,
        names: KeyedLock,
    ) -> None:
        self._cloning = cloning
        self._lifecycle = lifecycle
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
            match self._lifecycle.find_by_name(request.target_name):
                case Failure(error):
                    return Failure(error)
                case Success(VMRecord() as existing):
                    return adopt_existing(existing, self._owner)
            return self._cloning.clone(request, self._owner).map(lambda vm_id: CreatedVM(id=vm_id))
