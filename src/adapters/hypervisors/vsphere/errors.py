"""vSphere faults -> ProviderError kinds, in one table keyed by the fault's class."""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Sequence
from typing import Any

from pyVmomi import vim as untyped_vim
from pyVmomi import vmodl as untyped_vmodl

from pyrigaud.domain.errors import ErrorKind, ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim
vmodl: Any = untyped_vmodl

# First match wins, so subclasses come before their parents.
KIND_BY_FAULT: Sequence[tuple[type[BaseException], ErrorKind]] = (
    (vim.fault.NotFound, ErrorKind.NOT_FOUND),
    (vmodl.fault.ManagedObjectNotFound, ErrorKind.NOT_FOUND),
    (vim.fault.InvalidPowerState, ErrorKind.FAILED_PRECONDITION),
    (vim.fault.InvalidState, ErrorKind.FAILED_PRECONDITION),
    (vim.fault.ToolsUnavailable, ErrorKind.FAILED_PRECONDITION),
    (vim.fault.DuplicateName, ErrorKind.ALREADY_EXISTS),
    (vim.fault.AlreadyExists, ErrorKind.ALREADY_EXISTS),
    (vmodl.fault.NotSupported, ErrorKind.UNSUPPORTED),
    (vmodl.fault.NotImplemented, ErrorKind.UNSUPPORTED),
    (vmodl.fault.InvalidArgument, ErrorKind.INVALID_SPEC),
    (vim.fault.InvalidName, ErrorKind.INVALID_SPEC),
    (vim.fault.InsufficientResourcesFault, ErrorKind.RESOURCE_EXHAUSTED),
    (vim.fault.NoDiskSpace, ErrorKind.RESOURCE_EXHAUSTED),
    (vim.fault.InvalidLogin, ErrorKind.UNAVAILABLE),
    (vim.fault.NotAuthenticated, ErrorKind.UNAVAILABLE),
    (vmodl.fault.HostCommunication, ErrorKind.UNAVAILABLE),
    (ssl.SSLError, ErrorKind.UNAVAILABLE),
    (OSError, ErrorKind.UNAVAILABLE),
    (http.client.HTTPException, ErrorKind.UNAVAILABLE),
)

# What a failed call through the session can raise and still be an expected failure.
EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    vmodl.MethodFault,
    OSError,
    http.client.HTTPException,
)


class AdapterError(Exception):
    """An expected failure raised inside the adapter and turned back into a value at its edge."""

    def __init__(self, error: ProviderError) -> None:
        super().__init__(str(error))
        self.error = error


def fault_kind(error: BaseException) -> ErrorKind:
    return next(
        (kind for fault, kind in KIND_BY_FAULT if isinstance(error, fault)), ErrorKind.INTERNAL
    )


def is_missing(error: BaseException) -> bool:
    return fault_kind(error) is ErrorKind.NOT_FOUND


def provider_error(error: BaseException, doing: str) -> ProviderError:
    """The ProviderError for a failure while `doing` something (unknown faults: INTERNAL)."""
    message = getattr(error, "msg", "") or str(error) or type(error).__name__
    return ProviderError(kind=fault_kind(error), message=f"{doing}: {message}")
