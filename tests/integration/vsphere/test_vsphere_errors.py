"""vSphere faults map to the error kinds the manager's circuit breaker needs (CONTRACT.md §5)."""

from __future__ import annotations

from typing import Any

import pytest
from pyVmomi import vim as untyped_vim
from pyVmomi import vmodl as untyped_vmodl

from pyrigaud.adapters.hypervisors.vsphere.errors import provider_error
from pyrigaud.adapters.hypervisors.vsphere.session import LoginError
from pyrigaud.domain.errors import ErrorKind

vim: Any = untyped_vim  # pyVmomi's fault constructors are untyped
vmodl: Any = untyped_vmodl


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (vim.fault.NotFound(), ErrorKind.NOT_FOUND),
        (vmodl.fault.ManagedObjectNotFound(), ErrorKind.NOT_FOUND),
        (vim.fault.InvalidPowerState(), ErrorKind.FAILED_PRECONDITION),
        (vim.fault.DuplicateName(), ErrorKind.ALREADY_EXISTS),
        (vmodl.fault.NotSupported(), ErrorKind.UNSUPPORTED),
        (vmodl.fault.MethodNotFound(), ErrorKind.UNSUPPORTED),
        (vmodl.fault.InvalidArgument(), ErrorKind.INVALID_SPEC),
        (vim.fault.InvalidLogin(), ErrorKind.UNAVAILABLE),
        (ConnectionRefusedError(111, "refused"), ErrorKind.UNAVAILABLE),
        (LoginError("127.0.0.1:1 is down or is not a VIM server"), ErrorKind.UNAVAILABLE),
        (vmodl.fault.SystemError(), ErrorKind.INTERNAL),
    ],
)
def test_each_fault_has_its_kind_and_the_message_says_what_was_being_done(
    fault: BaseException, kind: ErrorKind
) -> None:
    error = provider_error(fault, "deleting VM 'vm-1'")
    assert error.kind is kind
    assert error.message.startswith("deleting VM 'vm-1': ")
