"""GetCapabilities, and the gate every optional operation passes through."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.application.ports import CapabilitySource
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Capabilities


class GetCapabilities:
    def __init__(self, source: CapabilitySource) -> None:
        self._source = source

    def __call__(self) -> Capabilities:
        return self._source.capabilities()


def require(supported: bool, what: str) -> Result[None, ProviderError]:
    """UNSUPPORTED unless the backend says it can, so answers match GetCapabilities."""
    if supported:
        return Success(None)
    return Failure(ProviderError.unsupported(f"this provider does not support {what}"))


def require_listed(
    value: str, supported: tuple[str, ...], what: str
) -> Result[None, ProviderError]:
    if value in supported:
        return Success(None)
    listed = ", ".join(supported) or "none"
    return Failure(
        ProviderError.unsupported(f"{what} {value!r} is not supported (supported: {listed})")
    )
