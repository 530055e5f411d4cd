"""The names the provider gives what a request leaves unnamed, derived here only.

A snapshot without a name hint is named for the time it is taken; an image prepared without a
target name is named from its source (the same source, the same name, so repeating the call
is idempotent); a disk imported without a target name is named as the staged object, without
its format's suffix. Each name is checked as any given name is, where it is used.
"""

from __future__ import annotations

import re
import time
from hashlib import sha256

from pyrigaud.domain.models import ImageSource

STAGED_SUFFIXES = (".qcow2", ".raw", ".vmdk", ".img")


def snapshot_name(taken_at: float) -> str:
    """`snapshot-YYYYmmdd-HHMMSS`, in UTC."""
    return time.strftime("snapshot-%Y%m%d-%H%M%S", time.gmtime(taken_at))


def image_name(source: ImageSource) -> str:
    """The source's last path segment (made safe, at most 48 characters) and a digest of the
    whole source; `image-<digest>` when nothing usable is left of the segment."""
    basis = source.template_name or source.path or source.url
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", basis.rstrip("/").rsplit("/", 1)[-1])[:48].strip(".-_")
    digest = sha256(basis.encode()).hexdigest()[:8]
    return f"{stem}-{digest}" if stem and stem[0].isalnum() else f"image-{digest}"


def imported_disk_name(staged_name: str) -> str:
    """The staged object's name without its format's suffix (every one a staged disk may
    carry, in turn)."""
    stem = staged_name
    for suffix in STAGED_SUFFIXES:
        stem = stem.removesuffix(suffix)
    return stem
