"""Delete: idempotent, a missing VM is success."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.application.ports import VMLifecycle
from pyrigaud.domain.errors import ErrorKind, ProviderError


class DeleteVM:
    def __init__(self, lifecycle: VMLifecycle) -> None:
        self._lifecycle = lifecycle

    def __call__(self, vm_id: str) -> Result[None, ProviderError]:
        result = self._lifecycle.delete(vm_id)
        match result:
            case Failure(ProviderError(kind=ErrorKind.NOT_FOUND)):
                return Success(None)
        return result
