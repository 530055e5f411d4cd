"""The package's one edge: where libvirt's exceptions become values, and only here.

libvirt answers every refusal by raising libvirtError, and the files this package touches (a
snapshot export's scratch files, an image file on this host, the SSH key copies) raise
OSError; the code that drives them lets those rise (an expected failure of its own is a
Failure value it returns) until the edge turns one into a ProviderError: a `Caught` block (or
`caught` around a callable). The port modules' way in is LibvirtHost (host.py), which
describes any libvirtError by what it was doing; a helper that expects a particular code (a
driver that cannot stream, a lookup that misses) describes that one itself and lets the
others rise.

A call whose refusal is an answer, not a failure, says so through a `Refusing` block or one
of the helpers below, so no other module catches libvirtError: `or_none` (a lookup that
misses is None), `answer` and `refusal` (a driver that refuses a variant: the caller falls
back), `best_effort` (a cleanup whose own failure is not the one to tell, or a call a driver
may lack), and `RAISED_BY_LIBVIRT` (what `undone_on_failure` undoes on, when only libvirt's
refusals are).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import libvirt
from returns.result import Failure, Result

from pyrigaud.adapters.hypervisors.libvirt.errors import MISSING_CODES, error_code
from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")

# How a libvirtError reads as a ProviderError; None: not this describer's to say, it rises on.
Describer = Callable[[libvirt.libvirtError], ProviderError | None]

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
NO_ACCESS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
RAISED_BY_LIBVIRT: tuple[type[BaseException], ...] = (libvirt.libvirtError,)
ANY_CODE = None  # for `codes` below: whatever libvirt's code


@dataclass(frozen=True)
class Refused:
    """libvirt's refusal of a call, as a value: its code and libvirt's message."""

    code: int
    message: str


class Caught:
    """The edge as a `with` block: a libvirtError raised in it becomes `failure`, the Failure
    `describe` makes of it, and with `files_doing` (what the block does) an OSError a file's
    failure. The block returns its Result; after the block, the caller returns `failure`:

        with Caught(describe) as edge:
            return action()
        return edge.failure

    A `with` adds no frame to the work it guards, where a wrapper and its callable add two."""

    failure: Result[Any, ProviderError]

    def __init__(self, describe: Describer, *, files_doing: str = "") -> None:
        self._describe = describe
        self._files_doing = files_doing

    def __enter__(self) -> Caught:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _trace: object
    ) -> bool:
        if isinstance(error, libvirt.libvirtError):
            described = self._describe(error)
            if described is None:
                return False
            self.failure = Failure(described)
            return True
        if isinstance(error, OSError) and self._files_doing:
            self.failure = Failure(file_error(error, self._files_doing))
            return True
        return False


def caught(
    action: Callable[[], Result[T, ProviderError]],
    describe: Describer,
    *,
    files_doing: str = "",
) -> Result[T, ProviderError]:
    """`action`'s Result; a libvirtError it raises as the Failure `describe` makes of it, and
    with `files_doing` (what the action does) an OSError as a file's failure (`Caught`)."""
    with Caught(describe, files_doing=files_doing) as edge:
        return action()
    return edge.failure


def file_error(error: OSError, doing: str) -> ProviderError:
    """A file of this process refused: no room is RESOURCE_EXHAUSTED, no access
    FAILED_PRECONDITION, anything else UNAVAILABLE."""
    reason = os.strerror(error.errno) if error.errno else str(error)
    message = f"{doing}: {reason}"
    if error.errno in NO_ROOM:
        return ProviderError.resource_exhausted(message)
    if error.errno in NO_ACCESS:
        return ProviderError.failed_precondition(message)
    return ProviderError.unavailable(message)


class Refusing:
    """A `with` block in which libvirt's refusal with one of `codes` (ANY_CODE: any) is an
    answer, `refused`, unless `unless()`, asked then, says it is not the answer after all; any
    other libvirtError rises on, to the edge (`Caught`). Like it, it adds no frame."""

    refused: Refused

    def __init__(
        self, codes: Collection[int] | None, *, unless: Callable[[], bool] | None = None
    ) -> None:
        self._codes = codes
        self._unless = unless

    def __enter__(self) -> Refusing:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _trace: object
    ) -> bool:
        if not isinstance(error, libvirt.libvirtError):
            return False
        code = error_code(error)
        if self._codes is not None and code not in self._codes:
            return False
        if self._unless is not None and self._unless():
            return False
        self.refused = Refused(code, error.get_error_message() or str(error))
        return True


def answer(
    call: Callable[[], T],
    codes: Collection[int] | None,
    *,
    unless: Callable[[], bool] | None = None,
) -> T | Refused:
    """`call()`, or how libvirt refused it when it refused with one of `codes` (ANY_CODE: any),
    unless `unless()`, asked then, says this refusal is not the answer after all; any other
    libvirtError rises on, to `caught`."""
    with Refusing(codes, unless=unless) as refusing:
        return call()
    return refusing.refused


def refusal(
    call: Callable[[], object],
    codes: Collection[int] | None,
    *,
    unless: Callable[[], bool] | None = None,
) -> Refused | None:
    """None when `call()` went through; else `answer`'s Refused (the caller falls back)."""
    with Refusing(codes, unless=unless) as refusing:
        call()
        return None
    return refusing.refused


def or_none(call: Callable[[], T], codes: Collection[int] | None = MISSING_CODES) -> T | None:
    """`call()`, or None when libvirt answers with one of `codes` (ANY_CODE: any); by default,
    that what it looks up is not there."""
    with Refusing(codes):
        return call()
    return None


def best_effort(call: Callable[[], T]) -> T | None:
    """`call()`, or None when libvirt refuses it at all: a cleanup whose own failure is not
    the one to tell, or a call a driver or a closed connection may not answer."""
    with Refusing(ANY_CODE):
        return call()
    return None
