"""The vSphere package's one edge: where what pyVmomi and the network raise while a call into
vCenter runs (or while a disk's bytes come off a lease already open) becomes a Failure.

Code inside the package returns its own expected failures as Results and lets pyVmomi's
faults fly; the edge maps those by `faults.py`'s table and flattens the action's Result, so a
port answers one Result whichever way the call failed. What is neither a fault nor a reply
this pyVmomi cannot read is a bug of ours and stays an exception.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from pyVmomi import SoapAdapter
from returns.result import Failure, Result

from pyrigaud.adapters.hypervisors.vsphere.faults import EXPECTED_FAILURES, provider_error
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")

SOAP_READER = SoapAdapter.__file__  # where pyVmomi reads vCenter's replies
PYVMOMI_FOLDER = os.path.dirname(SOAP_READER) + os.sep


def run(
    session: VSphereSession, doing: str, operation: Callable[[Any], Result[T, ProviderError]]
) -> Result[T, ProviderError]:
    """`operation(connection)` through the session: its own Result, or the fault it raised as
    the ProviderError of its kind while `doing` something (for the message: "deleting VM
    'vm-42'")."""
    return attempt(doing, lambda: session.call(operation))


def attempt(doing: str, action: Callable[[], Result[T, ProviderError]]) -> Result[T, ProviderError]:
    """`action()`'s Result, or what it raised as a Failure, for work that needs no session
    call (a disk's bytes read off a lease already open, converted in the pod)."""
    try:
        return action()
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
