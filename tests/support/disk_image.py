"""Disks for the disk image codec tests, and the real qemu-img that checks what they make."""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

GRAIN = 65536
MIB = 1024 * 1024


def sparse_disk(size: int, seed: int) -> bytes:
    """A disk of `size` bytes: random 64 KiB grains, zero grains and grains zero but for a
    few bytes, mixed; the tail is not grain- or sector-aligned when `size` is not."""
    chooser = random.Random(seed)
    disk = bytearray(size)
    for start in range(0, size, GRAIN):
        end = min(start + GRAIN, size)
        kind = chooser.choice(("zero", "zero", "random", "speck"))
        if kind == "random":
            disk[start:end] = chooser.randbytes(end - start)
        elif kind == "speck":
            disk[chooser.randrange(start, end)] = 0xA5
    return bytes(disk)


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    return (data[start : start + size] for start in range(0, len(data), size))


def file_chunks(path: Path, size: int = 4 * MIB) -> Iterator[bytes]:
    with path.open("rb") as file:
        while chunk := file.read(size):
            yield chunk


# Creating a LUKS-encrypted image, qemu-img times PBKDF2 by the thread's CPU time; where that
# clock ticks coarsely (a small VM), every reading can be zero and qemu-img gives up with this.
_PBKDF_TIMING_FAILED = "Unable to get accurate CPU usage"
# Measured here: half of the creations fail so, even on an idle machine; a failed one returns
# at once, so trying 30 times costs little and leaves a chance of about 1 in 10^9 of failing.
PBKDF_TIMING_TRIES = 30


def qemu_img(*args: str | Path) -> str:
    command = ["qemu-img", *map(str, args)]
    for _ in range(PBKDF_TIMING_TRIES):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if _PBKDF_TIMING_FAILED not in done.stderr:
            break
    assert done.returncode == 0, done.stderr
    return done.stdout


def qemu_info(path: Path) -> Any:
    return json.loads(qemu_img("info", "--output=json", path))


def to_raw(path: Path, out: Path) -> bytes:
    qemu_img("convert", "-O", "raw", path, out)
    return out.read_bytes()


def qemu_reading(path: Path | str, disk_format: str, out: Path) -> bytes:
    """The disk as qemu-img reads it from `path` in `disk_format` (converted to raw at `out`)."""
    qemu_img("convert", "-f", disk_format, "-O", "raw", path, out)
    return out.read_bytes()


def write_file(path: Path, chunks: Iterable[bytes]) -> list[int]:
    """Write the chunks; their sizes."""
    sizes = []
    with path.open("wb") as file:
        for chunk in chunks:
            sizes.append(len(chunk))
            file.write(chunk)
    return sizes
