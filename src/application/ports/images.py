"""Preparing images that VMs are later created from."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import PreparedImage, PrepareImageRequest


class Images(Protocol):
    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        """Idempotent by target name; VMs made from the image never share a writable disk."""
        ...
