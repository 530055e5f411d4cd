"""GetCapabilities, what the application claims of every disk transfer whatever the backend,
and the gate every optional operation passes through."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.application.ports import CapabilitySource
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Capabilities, StagingType, TransferMode

# The one mode a transfer is carried out in here: its bytes pass through this provider (a
# direct one through a type the hypervisor reaches itself is carried out so: `transfers`).
RELAY_ONLY = (TransferMode.RELAY.value,)


class GetCapabilities:
    def __init__(self, source: CapabilitySource) -> None:
        self._source = source

    def __call__(self) -> Capabilities:
        return self._source.capabilities()


class TransferClaims:
    """The backend's capabilities with what the application decides of disk transfers, not the
    hypervisor: they stage through `staging_types` (the types whose store this provider built,
    for export and import alike) and are carried out as relay only. Filled in here once, for
    GetCapabilities and for every use case's gate alike."""

    def __init__(self, backend: CapabilitySource, staging_types: tuple[StagingType, ...]) -> None:
        self._backend = backend
        self._claims = {
            "supported_export_backends": staging_types,
            "supported_import_backends": staging_types,
            "supported_transfer_modes": RELAY_ONLY,
        }
        self._told: tuple[Capabilities, Capabilities] | None = None  # the backend's, and ours

    def capabilities(self) -> Capabilities:
        told = self._backend.capabilities()
        if self._told is None or self._told[0] is not told:
            self._told = (told, told.model_copy(update=self._claims))
        return self._told[1]


def require(supported: bool, what: str) -> Result[None, ProviderError]:
    """UNSUPPORTED unless the backend says it can, so answers match GetCapabilities."""
    if supported:
        return Success(None)
    return Failure(ProviderError.not_supported(what))


def require_listed(
    value: str, supported: tuple[str, ...], what: str
) -> Result[None, ProviderError]:
    if value in supported:
        return Success(None)
    listed = ", ".join(supported) or "none"
    return Failure(
        ProviderError.unsupported(f"{what} {value!r} is not supported (supported: {listed})")
    )
