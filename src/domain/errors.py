"""The closed set of expected failures.

Every expected failure in pyrigaud is a `ProviderError` value of one `ErrorKind`, carried in a
`returns` Result from the adapter edge where a library's exception became it to the gRPC
entrypoint, which maps each kind to exactly one status code (docs/architecture.md, "Error
model"). Exceptions are for bugs only.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class ErrorKind(StrEnum):
    NOT_FOUND = "not_found"
    INVALID_SPEC = "invalid_spec"
    FAILED_PRECONDITION = "failed_precondition"
    ALREADY_EXISTS = "already_exists"
    PERMISSION_DENIED = "permission_denied"
    UNSUPPORTED = "unsupported"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ProviderError(BaseModel):
    """An expected failure: what kind it is and a message a user can act on."""

    model_config = ConfigDict(frozen=True)

    kind: ErrorKind
    message: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"

    @classmethod
    def not_found(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.NOT_FOUND, message=message)

    @classmethod
    def vm_not_found(cls, vm_id: str) -> ProviderError:
        return cls.not_found(f"VM {vm_id!r} not found")

    @classmethod
    def invalid_spec(cls, field: str, problem: str) -> ProviderError:
        """Bad input; the message always starts with the offending field."""
        return cls(kind=ErrorKind.INVALID_SPEC, message=f"{field}: {problem}")

    @classmethod
    def failed_precondition(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.FAILED_PRECONDITION, message=message)

    @classmethod
    def already_exists(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.ALREADY_EXISTS, message=message)

    @classmethod
    def permission_denied(cls, message: str) -> ProviderError:
        """Storage refused the credentials the request carried (never echoed)."""
        return cls(kind=ErrorKind.PERMISSION_DENIED, message=message)

    @classmethod
    def unsupported(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.UNSUPPORTED, message=message)

    @classmethod
    def resource_exhausted(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.RESOURCE_EXHAUSTED, message=message)

    @classmethod
    def unavailable(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.UNAVAILABLE, message=message)

    @classmethod
    def internal(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.INTERNAL, message=message)
