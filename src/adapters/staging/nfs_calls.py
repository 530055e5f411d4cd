"""libnfs's answers as this provider's errors, and the mounts every NFS call goes through: the
store (`nfs.py`) and its readers and writers (`nfs_files.py`) alike.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.libnfs import LibnfsMissingError, NfsError, NfsSession
from pyrigaud.adapters.staging.nfs_location import nfs_options
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedLocation

T = TypeVar("T")


def nfs_path(key: str) -> str:
    """A path inside the mounted export, as libnfs wants it."""
    return f"/{key}"


def mounted(location: StagedLocation) -> Result[NfsSession, ProviderError]:
    options = nfs_options(location)
    return nfs_call(
        location,
        "reach",
        partial(
            NfsSession,
            # The address the storage gate checked, when it did.
            location.address or options.server.strip("[]"),
            location.container,
            options.uid,
            options.gid,
        ),
        mounting=True,
    )


def in_session(
    location: StagedLocation, work: Callable[[NfsSession], Result[T, ProviderError]]
) -> Result[T, ProviderError]:
    """`work` on a mount of its own, unmounted after."""

    def worked(session: NfsSession) -> Result[T, ProviderError]:
        try:
            return work(session)
        finally:
            session.close()

    return mounted(location).bind(worked)


def nfs_call(
    location: StagedLocation, action: str, call: Callable[[], T], mounting: bool = False
) -> Result[T, ProviderError]:
    """`call`, with libnfs's failures turned into this provider's kinds: the one place this
    package's NFS exceptions become values."""
    try:
        return Success(call())
    except LibnfsMissingError as error:
        return Failure(ProviderError.unsupported(f"nfs staging: {error}"))
    except NfsError as error:
        return Failure(_refusal(location, action, error, mounting))


def _refusal(
    location: StagedLocation, action: str, error: NfsError, mounting: bool
) -> ProviderError:
    what = f"cannot {action} {location.url}"
    options = nfs_options(location)
    identity = f"uid {options.uid if options.uid is not None else os.getuid()}, gid " + str(
        options.gid if options.gid is not None else os.getgid()
    )
    if mounting and error.code in (errno.EACCES, errno.EPERM):
        return ProviderError.permission_denied(
            f"{what}: the server refused to mount {location.container!r} "
            f"(absent, or not exported to this client): {error}"
        )
    if mounting:
        return ProviderError.unavailable(
            f"{what}: NFS server {options.server!r} did not answer: {error}"
        )
    if error.code in (errno.EACCES, errno.EPERM):
        return ProviderError.permission_denied(f"{what}: the server refused {identity}: {error}")
    if error.code == errno.ENOENT:
        return ProviderError.not_found(f"{what}: no such file ({error})")
    if error.code in (errno.ENOSPC, errno.EDQUOT):
        return ProviderError.resource_exhausted(f"{what}: {error}")
    if error.code == errno.EEXIST:
        return ProviderError.failed_precondition(f"{what}: {error}")
    return ProviderError.unavailable(f"{what}: {error}")
