"""Where a migrating disk is staged, as every staging type has it.

The manager sends the same URL to ExportDisk (`destination_url`) and ImportDisk (`source_url`),
with storage options and credentials (docs/migration.md). What a URL, its options and its
credentials may be differs per staging type, and each type's adapter decides it
(`adapters/staging/<type>_location.py`, one line each in `adapters/staging/registry.py`): the
domain keeps only what is the same for every type, so a new type needs no edit here. A staging
type is an open name (the manager's own, `pvc`, `s3`, ...), not a closed list.

The same for every type: a location is one object in a container (a PVC, a bucket, an export)
under a relative key, carrying its type's own options value and, when the type takes any,
credentials that never appear in a repr or a message.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, NewType

from pydantic import Field
from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.values import Value

StagingType = NewType("StagingType", str)
"""Where a migrating disk is staged: the manager's name for it (its VMMigration's
spec.storage.type). Called a type here so that "backend" names one thing only, the hypervisor a
provider serves."""


class StagedHost(Value):
    """The host a location's connections go to, and the domain path of the option naming it."""

    field: str
    host: str
    port: int


class StagingOptions(Value):
    """What a staging type's rules made of the storage options: each type's adapter subclasses
    it with the options it reads. This base is a type that reads none."""

    # Whether the hypervisor itself can reach the staged object (a direct transfer), or only the
    # provider can, relaying the bytes.
    reached_by_hypervisor: ClassVar[bool] = False

    def host(self) -> StagedHost | None:
        """The host the store's connections go to, for the storage gate (None: nothing to
        reach, or a host the request cannot choose)."""
        return None


class StagingCredentials(Value):
    """A staging type's credentials, subclassed by the type that takes some: no field of theirs
    shows in a repr or a str, whatever the subclass declares."""

    def __repr_args__(self) -> list[tuple[str | None, Any]]:
        return []


class StagedDigest(Value):
    """What was staged or read: lowercase hex SHA-256 and the number of bytes."""

    sha256: str
    size_bytes: int


class StagedSweep(Value):
    """What a sweep of the staging storage removed, and what it could not look through."""

    removed: int = 0
    failures: tuple[ProviderError, ...] = ()


class StagedLocation(Value):
    """One staged object, named by the request's `field` (`destination_url`, `source_url`).
    `container` is where the type keeps objects (a PVC, a bucket, an export); `key` is the
    object's path inside it (relative: no leading '/')."""

    staging_type: StagingType
    field: str
    url: str
    container: str
    key: str
    options: StagingOptions = StagingOptions()
    credentials: StagingCredentials | None = Field(default=None, repr=False)
    # The checked address the store's connections go to ("": the host as named), set by the
    # storage gate once it resolved and checked the host.
    address: str = ""

    @property
    def name(self) -> str:
        """The object's own name, the last segment of its key."""
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> str:
        """The key's folder inside the container ("" at its top)."""
        return self.key.rsplit("/", 1)[0] if "/" in self.key else ""

    def companion(self, suffix: str) -> StagedLocation:
        """The object staged beside this one, named after it with `suffix` (a disk's hardware
        manifest): same container, options, credentials and checked address."""
        return self.model_copy(update={"key": f"{self.key}{suffix}", "url": f"{self.url}{suffix}"})


UNSAFE_CHARACTERS = re.compile(r"[\x00-\x20\x7f?#&\\]")


def relative_key(field: str, path: str) -> Result[str, ProviderError]:
    """`path` as a key that stays inside its container: relative, without '.', '..', empty
    parts or characters a URL or a shell would read otherwise."""
    segments = path.split("/")
    if any(segment in ("", ".", "..") or UNSAFE_CHARACTERS.search(segment) for segment in segments):
        return Failure(
            ProviderError.invalid_spec(
                field,
                "its path must be relative, without '.', '..', empty parts or control characters",
            )
        )
    return Success(path)
