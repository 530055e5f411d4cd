"""What vCenter's faults (and the network's errors on the way to it) mean as ProviderError
kinds, in one table keyed by the fault's class (a pod's own file system with no room left is
told by its errno first): the knowledge `calls.py`, the package's one
edge, applies when a call fails, kept apart from the edge so that code reading a fault it
expects (a task's, a lookup's NOT_FOUND) asks the same table."""

from __future__ import annotations

import errno
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
    # vCenter's own failure inside a call (its "internal error"): the server's, not ours.
    (vmodl.fault.SystemError, ErrorKind.UNAVAILABLE),
    (ssl.SSLError, ErrorKind.UNAVAILABLE),
    (OSError, ErrorKind.UNAVAILABLE),
    (http.client.HTTPException, ErrorKind.UNAVAILABLE),
)

# A fault the table does not name (a FileFault, an InvalidDeviceSpec, ...) is vCenter refusing
# the operation as things stand: FAILED_PRECONDITION, with vCenter's reason, so the manager
# neither retries it blindly nor counts it against the provider's circuit breaker.
UNNAMED_FAULT_KIND = ErrorKind.FAILED_PRECONDITION

# A file of this pod with no room left (a full PVC a qcow2 export is made in, a full scratch
# directory): no network error, and no use trying again at once.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})

# What a failed call through the session can raise and still be an expected failure.
EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    vmodl.MethodFault,
    OSError,
    http.client.HTTPException,
)


def fault_kind(error: BaseException) -> ErrorKind:
    if isinstance(error, OSError) and error.errno in NO_ROOM:
        return ErrorKind.RESOURCE_EXHAUSTED
    return next(
        (kind for fault, kind in KIND_BY_FAULT if isinstance(error, fault)), UNNAMED_FAULT_KIND
    )


def is_missing(error: BaseException) -> bool:
    return fault_kind(error) is ErrorKind.NOT_FOUND


def provider_error(error: BaseException, doing: str) -> ProviderError:
    """The ProviderError for a failure while `doing` something (a fault the table
    does not name: UNNAMED_FAULT_KIND)."""
    message = getattr(error, "msg", "") or str(error) or type(error).__name__
    return ProviderError(kind=fault_kind(error), message=f"{doing}: {message}")


def fault_message(fault: Any) -> str:
    """A failed task's fault as ProviderError text (kind and message, never a traceback)."""
    if isinstance(fault, BaseException):
        return str(provider_error(fault, "vSphere task failed"))
    return f"vSphere task failed: {fault}"
