"""The valid images the fuzzer mutates, made by the real qemu-img (and pyrigaud's own
streamOptimized writer, which lays a vmdk out as VMware does) from one fixed 4 MiB disk, once
per test process: each is a few hundred KiB to a few MiB, with data in several clusters or
grains, zero ones between them, and clusters that compress."""

from __future__ import annotations

import functools
import random
import re
import subprocess
import tempfile
from pathlib import Path

from pyrigaud.adapters.disk_images.stream_optimized import encode_stream_optimized

from support.disk_image import chunked

DISK_BYTES = 4 * 1024 * 1024
_STRIPE = 65536
# Every seed image's name, and how qemu-img makes it from the raw disk (None: pyrigaud's own
# writer makes it).
SEED_IMAGES: dict[str, tuple[str, ...] | None] = {
    "qcow2": ("-O", "qcow2"),
    "qcow2-compressed": ("-O", "qcow2", "-c"),
    "qcow2-extended-l2": ("-O", "qcow2", "-o", "extended_l2=on"),
    "qcow2-v2-small-clusters": ("-O", "qcow2", "-o", "compat=0.10,cluster_size=4096"),
    "vmdk-stream": ("-O", "vmdk", "-o", "subformat=streamOptimized"),
    "vmdk-stream-footer": None,
}
SEED_FORMATS = {name: name.split("-")[0] for name in SEED_IMAGES}
# A vmdk's embedded descriptor names a random content ID (in hex, without leading zeros):
# fixed, so a seed is the same bytes in every run and a recipe's patches mean the same thing.
_CONTENT_ID = re.compile(rb"\nCID=([0-9a-f]{1,8})\n")
_FIXED_CONTENT_ID = b"fa22ed00"


def seed_disk() -> bytes:
    """Stripes of 64 KiB: random (they do not compress), text (they do), zero, and zero but
    for one byte."""
    chooser = random.Random(20261206)
    disk = bytearray(DISK_BYTES)
    for stripe, start in enumerate(range(0, DISK_BYTES, _STRIPE)):
        kind = stripe % 5
        if kind == 0:
            disk[start : start + _STRIPE] = chooser.randbytes(_STRIPE)
        elif kind == 1:
            disk[start : start + _STRIPE] = (b"stripe %d of the fuzzed disk " % stripe * 3000)[
                :_STRIPE
            ]
        elif kind == 3:
            disk[start + chooser.randrange(_STRIPE)] = 0xA5
    return bytes(disk)


@functools.cache
def seed_image(name: str) -> bytes:
    made = SEED_IMAGES[name]
    disk = seed_disk()
    if made is None:
        image = b"".join(encode_stream_optimized(chunked(disk, 1024 * 1024), DISK_BYTES))
    else:
        with tempfile.TemporaryDirectory() as folder:
            raw, converted = Path(folder) / "disk.raw", Path(folder) / "image"
            raw.write_bytes(disk)
            subprocess.run(
                ["qemu-img", "convert", "-f", "raw", *made, str(raw), str(converted)],
                check=True,
                capture_output=True,
            )
            image = converted.read_bytes()
    return _fixed_content_id(image)


def _fixed_content_id(image: bytes) -> bytes:
    """The image with its descriptor's content ID fixed, the descriptor's text grown into
    its zero padding (a shorter ID would otherwise move every byte after it)."""
    found = _CONTENT_ID.search(image)
    if found is None:
        return image
    start, end = found.span(1)
    text_end = image.index(b"\0", end)
    grown = len(_FIXED_CONTENT_ID) - (end - start)
    return image[:start] + _FIXED_CONTENT_ID + image[end:text_end] + image[text_end + grown :]
