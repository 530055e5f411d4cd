"""Copying a VM into a new one."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest, OwnerMark


class Cloning(Protocol):
    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """Make the clone (full, or linked when asked) with class and customization applied.

        Returns the new VM's id and the task making it, as VMLifecycle.start_create does; a
        target name already in use is ALREADY_EXISTS, for OwnershipRule to decide.
        """
        ...
