"""Which disk image format untrusted bytes are (a staged disk, a downloaded image), judged as they
stream: the format named from their start, before any of them is held as a disk, and the whole
image before a disk is made."""

from __future__ import annotations

from typing import Protocol

from returns.result import Result

from pyrigaud.domain.disk_images import JudgedImage
from pyrigaud.domain.errors import ProviderError


class ImageInspection(Protocol):
    """One image being judged: every byte goes through `feed`, in order."""

    def feed(self, chunk: bytes) -> None: ...

    def first_look(self) -> Result[JudgedImage, ProviderError]:
        """Once its first JUDGED_PREFIX_BYTES were fed (or all of a shorter image): its format
        and virtual size; INVALID_SPEC for one no disk may be made of, naming why."""
        ...

    def verdict(self) -> Result[JudgedImage, ProviderError]:
        """Once every byte was fed: the same, for the whole image."""
        ...


class ImageJudge(Protocol):
    def inspect(self, size_bytes: int | None, field: str) -> ImageInspection:
        """An inspection of an image of `size_bytes` (None: not told beforehand) whose
        refusals name `field`, the request field the image came from."""
        ...
