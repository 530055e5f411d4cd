"""The vSphere package's one edge: where what pyVmomi and the network raise while a call into
vCenter runs (or while a disk's bytes come off a lease already open) becomes a Failure.

Code inside the package returns its own expected failures as Results and lets pyVmomi's
faults fly; the edge maps those by `errors.py`'s table and flattens the action's Result, so a
port answers one Result whichever way the call failed. What is neither a fault nor a reply
this pyVmomi cannot read is a bug of ours and stays an exception.

A fault that is an answer, not a failure, is read through the helpers below, so no other
module catches one: `or_none` (what a read or lookup names is gone), `answer` (a fault the
caller expected, as a value: a file not found, a VM not powered off, no guest tools),
`best_effort` (a cleanup whose own failure is not the one to tell) and `transferring` (bytes
moved over HTTP beside the session: a network failure named for the edge to map).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pyVmomi import SoapAdapter
from returns.result import Failure, Result

from pyrigaud.adapters.hypervisors.vsphere.errors import (
    EXPECTED_FAILURES,
    is_missing,
    provider_error,
)
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")

SOAP_READER = SoapAdapter.__file__  # where pyVmomi reads vCenter's replies
PYVMOMI_FOLDER = os.path.dirname(SOAP_READER) + os.sep
NETWORK_FAILURES: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)

# Which of the faults a call raises its caller expects (the others rise on, to the edge).
Expected = Callable[[BaseException], bool]


@dataclass(frozen=True)
class Faulted:
    """A fault vCenter answered a call with that its caller expected, as a value."""

    fault: Any  # a vim or vmodl fault: its properties say more (existingState, ...)


def run(
    session: VSphereSession, doing: str, operation: Callable[[Any], Result[T, ProviderError]]
) -> Result[T, ProviderError]:
    """`operation(connection)` through the session: its own Result, or the fault it raised as
    the ProviderError of its kind while `doing` something (for the message: "deleting VM
    'vm-42'")."""
    with Edge(doing) as edge:
        return session.call(operation)
    return edge.failure


def attempt(doing: str, action: Callable[[], Result[T, ProviderError]]) -> Result[T, ProviderError]:
    """`action()`'s Result, or what it raised as a Failure, for work that needs no session
    call (a disk's bytes read off a lease already open, converted in the pod)."""
    with Edge(doing) as edge:
        return action()
    return edge.failure


class Edge:
    """The edge as a block, which `run` and `attempt` call in, and a caller may use itself
    where a wrapper's frame is not worth it: a fault the block raises stops here, as
    `failure`, which the caller returns after the block; anything else rises on.

        with Edge(doing) as edge:
            return work()
        return edge.failure
    """

    failure: Result[Any, ProviderError]  # set once the block raised a fault

    def __init__(self, doing: str) -> None:
        self._doing = doing

    def __enter__(self) -> Edge:
        return self

    def __exit__(self, _kind: object, error: BaseException | None, _trace: object) -> bool:
        if error is None:
            return False
        if isinstance(error, EXPECTED_FAILURES):
            self.failure = Failure(provider_error(error, self._doing))
            return True
        if isinstance(error, KeyError | AttributeError | TypeError | ValueError) and (
            _raised_reading_a_reply(error)
        ):
            self.failure = Failure(
                ProviderError.unavailable(
                    f"{self._doing}: vCenter answered with what this client cannot read (a "
                    f"newer server's fault or type?): {type(error).__name__}: {error}"
                )
            )
            return True
        return False


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


def answer(call: Callable[[], T], expected: Expected) -> T | Faulted:
    """`call()`, or the fault it raised when `expected` says the caller expects it; any other
    rises on, to the edge."""
    with _Expecting(expected) as expecting:
        return call()
    return Faulted(expecting.fault)


def fault_is(*faults: type[BaseException]) -> Expected:
    """An `Expected` of these fault classes (and their subclasses)."""
    return lambda error: isinstance(error, faults)


def or_none(call: Callable[[], T], expected: Expected = is_missing) -> T | None:
    """`call()`, or None when it raised an `expected` fault: by default, that what it reads
    or looks up is gone."""
    with _Expecting(expected):
        return call()
    return None


def best_effort(call: Callable[[], T]) -> T | None:
    """`call()`, or None when vCenter or the network failed it at all: a cleanup whose own
    failure is not the one to tell (the caller's is)."""
    return or_none(call, _any_fault)


def _any_fault(_error: BaseException) -> bool:
    return True


class _Expecting:
    """The block `answer` and `or_none` call in: a fault it raises that the caller `expected`
    stops here, as `fault`; any other rises on."""

    fault: BaseException  # set once the block raised an expected fault

    def __init__(self, expected: Expected) -> None:
        self._expected = expected

    def __enter__(self) -> _Expecting:
        return self

    def __exit__(self, _kind: object, error: BaseException | None, _trace: object) -> bool:
        if isinstance(error, EXPECTED_FAILURES) and self._expected(error):
            self.fault = error
            return True
        return False


@contextlib.contextmanager
def transferring(doing: str) -> Iterator[None]:
    """A block that moves bytes over HTTP beside the SOAP session (a lease's disk, a datastore
    file); a network failure in it rises as a ConnectionError naming what was `doing`, which
    the edge makes UNAVAILABLE (it may be retried)."""
    try:
        yield
    except NETWORK_FAILURES as error:
        raise ConnectionError(f"{doing}: {error}") from error
