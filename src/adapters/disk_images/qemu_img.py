"""qemu-img in the pod, bounded, as OpenStack and KubeVirt CDI run it on untrusted images: under
process limits (address space, CPU time, the size of any file it writes; `prlimit` sets them
before qemu-img starts), and killed as soon as its transfer's watch says stop (the RPC's caller
is gone) or its time is up.

One run per transfer, never per request: the hot path (Validate, Describe, ListVMs) forks
nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from returns.result import Failure, Result, Success

from pyrigaud.application.ports.disk_transfer import TransferWatch
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import TRANSFER_DEADLINE_SECONDS

logger = logging.getLogger(__name__)

QEMU_IMG = "qemu-img"
POLL_SECONDS = 0.1
MAX_REASON_CHARS = 500


# qemu-img reports a write the file system had no room for with the C library's own reason at
# the end of one of its lines ("error while writing at byte N: No space left on device"); it
# runs in the C locale, so the reason reads as this process's os.strerror has it.
_NO_ROOM = re.compile(
    "|".join(f": {re.escape(os.strerror(code))}$" for code in (errno.ENOSPC, errno.EDQUOT)),
    re.MULTILINE,
)


# A conversion's qemu-img reads and writes through a pool of worker threads, each with its
# stack and, past a few, a malloc arena of its own reserved: under 1 GiB of address space it
# may fail to start one (EAGAIN) under load, an image's fault it is not.
CONVERSION_ADDRESS_SPACE_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class QemuImgLimits:
    """CDI's bounds for judging an image (1 GiB of address space, 30 s of CPU) by default; a
    conversion raises the address space (CONVERSION_ADDRESS_SPACE_BYTES) and the CPU time,
    and bounds what it writes."""

    address_space_bytes: int = 1024**3
    cpu_seconds: int = 30
    file_size_bytes: int | None = None
    wall_seconds: float = 120.0


def refused_image(field: str) -> Callable[[str], ProviderError]:
    """qemu refusing an image, with its reason: the request's image (named by `field`) is bad
    input."""
    return lambda reason: ProviderError.invalid_spec(field, f"qemu-img refuses the image: {reason}")


STAGED_IMAGE_REFUSED = refused_image(fields.SOURCE_URL)


def run_qemu_img(
    arguments: Sequence[str],
    *,
    doing: str,
    watch: TransferWatch | None,
    limits: QemuImgLimits = QemuImgLimits(),
    pass_fds: Sequence[int] = (),
    refused: Callable[[str], ProviderError] = STAGED_IMAGE_REFUSED,
    output: IO[bytes] | None = None,
) -> Result[str, ProviderError]:
    """qemu-img's output (written to `output` instead, when given: output that grows with the
    image is kept out of memory, within `limits.file_size_bytes`); `refused(qemu's own reason)`
    when it refuses the image or goes past a limit, RESOURCE_EXHAUSTED when the file system
    it writes to has no room left (the pod's, not the image's fault), `watch`'s failure once
    it says stop (None: a run no caller stops, outside a transfer), UNAVAILABLE when
    `limits.wall_seconds` passed."""
    command = ["prlimit", f"--as={limits.address_space_bytes}", f"--cpu={limits.cpu_seconds}"]
    if limits.file_size_bytes is not None:
        command.append(f"--fsize={limits.file_size_bytes}")
    command += ["--", QEMU_IMG, *arguments]
    process = subprocess.Popen(  # noqa: S603 - a fixed program, arguments of ours
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if output is None else output,
        stderr=subprocess.PIPE,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
        env={**os.environ, "LC_ALL": "C"},
    )
    stopped = _watched(process, doing, watch, time.monotonic() + limits.wall_seconds)
    stdout, stderr = process.communicate()
    if stopped is not None:
        return Failure(stopped)
    if process.returncode != 0:
        said = stderr.decode(errors="replace").strip()
        reason = said.replace("\n", "; ")[:MAX_REASON_CHARS]
        if _NO_ROOM.search(said):
            return Failure(ProviderError.resource_exhausted(f"{doing}: no room left: {reason}"))
        if process.returncode < 0:
            reason = f"qemu-img went past its limits ({reason or f'signal {-process.returncode}'})"
        return Failure(refused(reason))
    return Success(stdout.decode(errors="replace") if stdout is not None else "")


def _watched(
    process: subprocess.Popen[bytes], doing: str, watch: TransferWatch | None, deadline: float
) -> ProviderError | None:
    """Wait for `process`; kill it (and say why) once `watch` says stop or the deadline
    passed."""
    while True:
        try:
            process.wait(timeout=POLL_SECONDS)
            return None
        except subprocess.TimeoutExpired:
            pass
        if watch is not None:
            match watch.check():
                case Failure(ProviderError() as error):
                    process.kill()
                    return error
        if time.monotonic() > deadline:
            process.kill()
            return ProviderError.unavailable(f"{doing}: qemu-img did not finish in time")


def checked_vmdk(
    vmdk: IO[bytes], virtual_size_bytes: int, field: str, *, watch: TransferWatch | None
) -> Result[None, ProviderError]:
    """A vmdk goes to vCenter as it is: qemu reads it whole first (every grain decoded through
    its tables, into a null sink), so one cut short, garbled or with absurd markers is refused
    with qemu's reason, naming `field`; stopped through `watch` (None: outside a transfer).
    A table check alone reads no grain."""
    vmdk.flush()
    descriptor = vmdk.fileno()
    return run_qemu_img(
        [
            *("convert", "-n", "-f", "vmdk", "--target-image-opts", f"/dev/fd/{descriptor}"),
            f"driver=null-co,size={virtual_size_bytes}",
        ],
        doing="reading a vmdk whole",
        watch=watch,
        limits=QemuImgLimits(
            address_space_bytes=CONVERSION_ADDRESS_SPACE_BYTES,
            cpu_seconds=int(TRANSFER_DEADLINE_SECONDS),
            wall_seconds=TRANSFER_DEADLINE_SECONDS,
        ),
        pass_fds=(descriptor,),
        refused=refused_image(field),
    ).map(lambda _: None)
