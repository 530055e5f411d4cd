"""The disk at an internal snapshot, as qemu itself reads it, without touching the VM.

libvirt's snapshots here are internal to the disk's qcow2 file, and libvirt has no call that
reads one without reverting the VM to it. So the qcow2 file's bytes (snapshots included) are
downloaded through a volume stream into an anonymous scratch file in the pod, the image the
overlay grew from into another: as it is when it stands alone as a raw or qcow2 volume, else a
temporary flattened raw copy of the chain libvirt makes on its host (an image is never written
after a VM grew from it, so its state now is its state at the snapshot); then
`qemu-img convert -l snapshot.name=<snapshot>`
in the pod, bounded (`disk_images/qemu_img.py`), writes the disk in the asked format into a
third: the staged object's own file where the store keeps one (a PVC), else a scratch file
then copied. What is staged is what qemu reads at that snapshot, whatever the base's size.

A running VM's file may be read too: an internal snapshot's tables and clusters are never
written again while the snapshot exists (QEMU copies a shared cluster before it writes), so
the copy holds the snapshot whole even as the guest keeps writing elsewhere.

Zero chunks are left as holes in the scratch files: a disk's free space costs no room.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from functools import partial
from typing import BinaryIO

from returns.result import Failure, Result

from pyrigaud.adapters.disk_images.qemu_img import (
    CONVERSION_ADDRESS_SPACE_BYTES,
    QemuImgLimits,
    run_qemu_img,
)
from pyrigaud.adapters.disk_images.scratch import counted, scratch_file, spool_sparse
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.storage import VolumeFacts
from pyrigaud.adapters.hypervisors.libvirt.volume_streams import VirStorageVol, volume_chunks
from pyrigaud.application.ports.disk_transfer import TransferWatch
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import TRANSFER_DEADLINE_SECONDS

# What qemu-img writes is the disk, with a qcow2's tables.
TABLES_ALLOWANCE_BYTES = 64 * 1024**2


def snapshot_image(
    conn: VirConnect,
    disk: VolumeFacts,
    snapshot: str,
    *,
    disk_format: str,
    backing: StandaloneVolume | None,
    scratch_dir: str | None,
    watch: TransferWatch,
    files: contextlib.ExitStack,
    out: BinaryIO,
) -> Result[None, ProviderError]:
    """`disk` (a qcow2 volume) as internal snapshot `snapshot` has it, made in `out` (empty)
    as a `disk_format` image; `backing` is the image it grew from, if any, standing alone.
    The bytes downloaded are counted, and qemu-img stopped, through `watch`. The scratch
    files are `files`' to close."""
    if disk.format != "qcow2":
        return Failure(
            ProviderError.failed_precondition(
                f"the disk {disk.path!r} is {disk.format}: only a qcow2 disk holds snapshots"
            )
        )
    overlay = files.enter_context(scratch_file(scratch_dir))
    volume = conn.storageVolLookupByPath(disk.path)
    # Each read spooled into its file, or the failure that cut it short (a cancelled call).
    spooled = counted(volume_chunks(conn, volume), watch).consumed_by(
        partial(spool_sparse, file=overlay)
    )
    image: dict[str, object] = {"driver": "qcow2", "file": _file(overlay), "backing": None}
    descriptors = [overlay.fileno()]
    if backing is not None:
        base = files.enter_context(scratch_file(scratch_dir))
        # Its chunks are read only once the overlay's are spooled (volume_chunks is lazy).
        chain = counted(volume_chunks(conn, backing.volume), watch)
        spooled = Result.do(
            None for _ in spooled for _ in chain.consumed_by(partial(spool_sparse, file=base))
        )
        image["backing"] = _backing(backing.format, base)
        descriptors.append(base.fileno())

    def converted(_: None) -> Result[None, ProviderError]:
        return _converted(
            disk,
            snapshot,
            disk_format=disk_format,
            image=image,
            descriptors=descriptors,
            out=out,
            watch=watch,
        )

    return spooled.bind(converted)


@dataclass(frozen=True)
class StandaloneVolume:
    """A volume with no backing of its own, in `format`."""

    volume: VirStorageVol
    format: str


def _backing(disk_format: str, base: BinaryIO) -> dict[str, object]:
    """How qemu-img opens the spooled backing image: a qcow2 one may name no backing of its
    own (it stood alone on the host; the pod has nothing else to open)."""
    if disk_format == "qcow2":
        return {"driver": "qcow2", "file": _file(base), "backing": None}
    return {"driver": disk_format, "file": _file(base)}


def _converted(
    disk: VolumeFacts,
    snapshot: str,
    *,
    disk_format: str,
    image: dict[str, object],
    descriptors: list[int],
    out: BinaryIO,
    watch: TransferWatch,
) -> Result[None, ProviderError]:
    """qemu-img's conversion of snapshot `snapshot` of `image` (read through `descriptors`)
    into `out`."""
    converted = run_qemu_img(
        [
            *("convert", "-l", f"snapshot.name={snapshot}", "-O", disk_format),
            f"json:{json.dumps(image)}",
            _path(out),
        ],
        doing=f"export of snapshot {snapshot!r}",
        watch=watch,
        limits=QemuImgLimits(
            address_space_bytes=CONVERSION_ADDRESS_SPACE_BYTES,
            cpu_seconds=int(TRANSFER_DEADLINE_SECONDS),
            file_size_bytes=disk.capacity_bytes + TABLES_ALLOWANCE_BYTES,
            wall_seconds=TRANSFER_DEADLINE_SECONDS,
        ),
        pass_fds=(*descriptors, out.fileno()),
        refused=lambda reason: ProviderError.failed_precondition(
            f"qemu-img cannot read snapshot {snapshot!r} of {disk.path!r}: {reason}"
        ),
    )
    return Result.do(None for _ in converted)


def _path(file: BinaryIO) -> str:
    """The anonymous scratch file as qemu-img, which inherits its descriptor, opens it."""
    return f"/dev/fd/{file.fileno()}"


def _file(file: BinaryIO) -> dict[str, str]:
    return {"driver": "file", "filename": _path(file)}
