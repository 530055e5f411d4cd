"""Create: idempotent by name for VMs this provider owns, and safe after a crash part-way."""

from __future__ import annotations

from returns.result import Failure, Result

from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import VMLifecycle
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CreateRequest, OwnerMark


class CreateVM:
    def __init__(self, lifecycle: VMLifecycle, ownership: OwnershipRule) -> None:
        self._lifecycle = lifecycle
        self._ownership = ownership

    def __call__(self, request: CreateRequest) -> Result[CreatedVM, ProviderError]:
        """Differences between the request and an existing VM are Reconfigure's job, not ours."""
        return self._ownership.make_unless_exists(
            request.name, lambda owner: self._start(request, owner)
        )

    def _start(self, request: CreateRequest, owner: OwnerMark) -> Result[CreatedVM, ProviderError]:
        """A class no hypervisor can make is refused here, once, for every backend."""
        refusal = request.vm_class.refusal()
        if refusal is not None:
            return Failure(refusal)
        return self._lifecycle.start_create(request, owner)
