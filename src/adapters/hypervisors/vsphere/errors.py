"""vSphere faults -> ProviderError kinds, in one table keyed by the fault's class, and `run`,
the edge where a call into vCenter becomes a Result."""

from __future__ import annotations

import http.client
import os
import ssl
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pyVmomi import SoapAdapter
from pyVmomi import vim as untyped_vim
from pyVmomi import vmodl as untyped_vmodl
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.domain.errors import ErrorKind, ExpectedError, ProviderError

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim
vmodl: Any = untyped_vmodl

T = TypeVar("T")

SOAP_READER = SoapAdapter.__file__  # where pyVmomi reads vCenter's replies
PYVMOMI_FOLDER = os.path.dirname(SOAP_READER) + os.sep

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
    # This server lacks the method (an older vCenter, an ESXi host without it): no bug of ours.
    (vmodl.fault.MethodNotFound, ErrorKind.UNSUPPORTED),
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


def run(
    session: VSphereSession, doing: str, operation: Callable[[Any], T]
) -> Result[T, ProviderError]:
    """`operation(instance)` through the session, its expected failures as values: an
    ExpectedError raised inside stands as it is, a fault becomes the ProviderError of its kind
    while `doing` something (for the message: "deleting VM 'vm-42'")."""
    return attempt(doing, lambda: session.call(operation))


def attempt(doing: str, action: Callable[[], T]) -> Result[T, ProviderError]:
    """`action()` with its expected failures as values, for work that needs no session call
    (a disk's bytes read off a lease already open, converted in the pod)."""
    try:
        return Success(action())
    except ExpectedError as error:
        return Failure(error.error)
    except EXPECTED_FAILURES as error:
        return Failure(provider_error(error, doing))
    except (KeyError, AttributeError, TypeError, ValueError) as error:
        if not _raised_reading_a_reply(error):
            raise
        return Failure(
            ProviderError.unavailable(
                f"{doing}: vCenter answered with what this client cannot read (a newer "
                f"server's fault or type?): {type(error).__name__}: {error}"
            )
        )


def _raised_reading_a_reply(error: BaseException) -> bool:
    """Whether pyVmomi's SOAP reader raised `error`: a fault type or property it does not
    know, which a newer vCenter sends (no bug of ours; pyVmomi raises KeyError or
    AttributeError from its deserializer rather than a fault)."""
    frames = traceback.extract_tb(error.__traceback__)
    return (
        bool(frames)
        and frames[-1].filename.startswith(PYVMOMI_FOLDER)
        and any(frame.filename == SOAP_READER for frame in frames)
    )


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


def fault_message(fault: Any) -> str:
    """A failed task's fault as ProviderError text (kind and message, never a traceback)."""
    if isinstance(fault, BaseException):
        return str(provider_error(fault, "vSphere task failed"))
    return f"vSphere task failed: {fault}"
