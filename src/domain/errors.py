"""The closed set of expected failures.

Every expected failure in pyrigaud is a `ProviderError` value of one `ErrorKind`, carried in a
`returns` Result from the adapter edge where a library's exception became it to the gRPC
entrypoint, which maps each kind to exactly one status code (docs/architecture.md, "Error
model"). Exceptions are for bugs only, so no kind here is INTERNAL: a bug raises, and the gRPC
edge alone answers it INTERNAL.
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


class ProviderError(BaseModel):
    """An expected failure: what kind it is and a message a user can act on.

    An error about one input keeps that input's domain path (`pyrigaud.domain.fields`) as
    `field`, and its message is `"<field>: <problem>"`; `mentions` are further domain paths the
    problem names. The gRPC edge writes them as the manager spells them
    (`entrypoints/grpc/wire/field_names.py`), so the domain never speaks the wire's vocabulary.
    """

    model_config = ConfigDict(frozen=True)

    kind: ErrorKind
    message: str
    field: str | None = None
    mentions: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"

    @classmethod
    def about(
        cls, kind: ErrorKind, field: str, problem: str, mentions: tuple[str, ...] = ()
    ) -> ProviderError:
        """A failure of `kind` about the input at `field`; the message starts with it."""
        return cls(kind=kind, message=f"{field}: {problem}", field=field, mentions=mentions)

    @classmethod
    def not_found(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.NOT_FOUND, message=message)

    @classmethod
    def vm_not_found(cls, vm_id: str) -> ProviderError:
        return cls.not_found(f"VM {vm_id!r} not found")

    @classmethod
    def invalid_spec(
        cls, field: str, problem: str, mentions: tuple[str, ...] = ()
    ) -> ProviderError:
        """Bad input; the message always starts with the offending field."""
        return cls.about(ErrorKind.INVALID_SPEC, field, problem, mentions)

    @classmethod
    def failed_precondition(cls, message: str, field: str | None = None) -> ProviderError:
        """With `field`, `message` is the problem with the input there."""
        return cls._of(ErrorKind.FAILED_PRECONDITION, message, field)

    @classmethod
    def already_exists(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.ALREADY_EXISTS, message=message)

    @classmethod
    def permission_denied(cls, message: str) -> ProviderError:
        """Storage refused the credentials the request carried (never echoed)."""
        return cls(kind=ErrorKind.PERMISSION_DENIED, message=message)

    @classmethod
    def unsupported(cls, message: str, field: str | None = None) -> ProviderError:
        """With `field`, `message` is the problem with the input there."""
        return cls._of(ErrorKind.UNSUPPORTED, message, field)

    @classmethod
    def not_supported(cls, what: str) -> ProviderError:
        """What this provider cannot do at all, as every refusal of a feature reads."""
        return cls(kind=ErrorKind.UNSUPPORTED, message=f"this provider does not support {what}")

    @classmethod
    def resource_exhausted(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.RESOURCE_EXHAUSTED, message=message)

    @classmethod
    def unavailable(cls, message: str) -> ProviderError:
        return cls(kind=ErrorKind.UNAVAILABLE, message=message)

    def mentioning(self, *paths: str) -> ProviderError:
        """This error, its message naming the domain paths `paths` too."""
        return self.model_copy(update={"mentions": (*self.mentions, *paths)})

    @classmethod
    def _of(cls, kind: ErrorKind, message: str, field: str | None) -> ProviderError:
        return cls(kind=kind, message=message) if field is None else cls.about(kind, field, message)
