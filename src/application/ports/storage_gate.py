"""Where a staging store may be reached: a request names the S3 endpoint and the NFS server."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedLocation


class StorageGate(Protocol):
    def admitted(self, location: StagedLocation) -> Result[StagedLocation, ProviderError]:
        """`location` with the checked address its connections go to (`address`), resolved
        once here; PERMISSION_DENIED naming the option when the store may not be reached, and
        then no connection is attempted."""
        ...
