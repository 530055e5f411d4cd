"""A downloaded image's format, judged from its first bytes before any of it is stored.

The download itself is the shared `pyrigaud.adapters.downloads`.
"""

from __future__ import annotations

from pyrigaud.adapters.disk_images.formats import QCOW2_MAGIC, qcow2_refusal


class UnusableImageError(Exception):
    """The image may not become a VM's disk (it would make QEMU open other files of the host)."""


def image_format_of(header: bytes) -> str:
    """The image's format, qcow2 or raw, judged by its magic number before a byte is stored.

    A qcow2 image naming a backing file or an external data file is refused: QEMU (or the
    conversion) would open that path on the host and give its content to the guest.
    """
    if not header:
        raise UnusableImageError("the server sent an empty image")
    if not header.startswith(QCOW2_MAGIC):
        return "raw"
    problem = qcow2_refusal(header)
    if problem:
        raise UnusableImageError(problem)
    return "qcow2"
