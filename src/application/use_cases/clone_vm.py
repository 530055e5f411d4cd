"""Clone: a new VM from an existing one, idempotent by target name like Create."""

from __future__ import annotations

from functools import partial

from returns.result import Result

from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import CapabilitySource, Cloning
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.application.use_cases.capabilities import require
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest


class CloneVM:
    def __init__(
        self,
        cloning: Cloning,
        capabilities: CapabilitySource,
        ownership: OwnershipRule,
    ) -> None:
        self._cloning = cloning
        self._capabilities = capabilities
        self._ownership = ownership

    def __call__(self, request: CloneRequest) -> Result[CreatedVM, ProviderError]:
        capabilities = self._capabilities.capabilities()
        gate = require(capabilities.supports_clone, "cloning")
        if request.linked:
            gate = Result.do(
                None
                for _ in gate
                for _ in require(capabilities.supports_linked_clones, "linked clones")
            )
        return Result.do(created for _ in gate for created in self._clone(request))

    def _clone(self, request: CloneRequest) -> Result[CreatedVM, ProviderError]:
        return self._ownership.make_unless_exists(
            request.target_name, partial(self._cloning.start_clone, request)
        )
