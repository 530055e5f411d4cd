"""Create: idempotent by name for VMs this provider owns, and safe after a crash part-way."""

from __future__ import annotations

from returns.result import Result

from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import VMLifecycle
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CreateRequest


class CreateVM:
    def __init__(self, lifecycle: VMLifecycle, ownership: OwnershipRule) -> None:
        self._lifecycle = lifecycle
        self._ownership = ownership

    def __call__(self, request: CreateRequest) -> Result[CreatedVM, ProviderError]:
        """Differences between the request and an existing VM are Reconfigure's job, not ours."""
        return self._ownership.make_unless_exists(
            request.name, lambda owner: self._lifecycle.start_create(request, owner)
        )
