"""Copying a VM into a new one."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest, OwnerMark


class Cloning(Protocol):
    def clone(self, request: CloneRequest, owner: OwnerMark) -> Result[str, ProviderError]:
        """Make the clone (full, or linked when asked) with class and customization applied.

        Returns the new VM's id; the same ownership rule as VMLifecycle.create applies to an
        existing VM of the target name.
        """
        ...
