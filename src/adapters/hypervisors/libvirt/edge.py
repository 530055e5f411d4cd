"""The package's one edge: where libvirt's exceptions become Failure values, and only here.

libvirt answers every refusal by raising libvirtError, and the files this package touches (a
snapshot export's scratch files, an image file on this host, the SSH key copies) raise
OSError; the code that drives them lets those rise (an expected failure of its own is a
Failure value it returns) until `caught` turns one into a ProviderError. The port modules'
way in is LibvirtHost (context.py), which describes any libvirtError by what it was doing; a
helper that expects a particular code (a driver that cannot stream, a lookup that misses)
describes that one itself and lets the others rise.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TypeVar

import libvirt
from returns.result import Failure, Result

from pyrigaud.domain.errors import ProviderError

T = TypeVar("T")

# How a libvirtError reads as a ProviderError; None: not this describer's to say, it rises on.
Describer = Callable[[libvirt.libvirtError], ProviderError | None]

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
NO_ACCESS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def caught(
    action: Callable[[], Result[T, ProviderError]],
    describe: Describer,
    *,
    files_doing: str = "",
) -> Result[T, ProviderError]:
    """`action`'s Result; a libvirtError it raises as the Failure `describe` makes of it, and
    with `files_doing` (what the action does) an OSError as a file's failure."""
    try:
        return action()
    except libvirt.libvirtError as error:
        described = describe(error)
        if described is None:
            raise
        return Failure(described)
    except OSError as error:
        if not files_doing:
            raise
        return Failure(file_error(error, files_doing))


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
