"""The raw disk at an internal snapshot, read without touching the VM.

libvirt's snapshots here are internal to the disk's qcow2 file, and libvirt has no call that
reads one without reverting the VM to it. So the qcow2 file's bytes (snapshots included) are
downloaded through a volume stream into an anonymous scratch file in the pod, and pyrigaud's
own qcow2 reader follows that snapshot's L1 table; the clusters the overlay leaves to its
backing chain are read from a temporary flattened raw copy of that chain, which libvirt makes
on its host (an image is never written after a VM grew from it, so its state now is its state
at the snapshot). Nothing runs on the host, and every libvirt transport works.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyrigaud.adapters.disk_images.qcow2 import read_qcow2
from pyrigaud.adapters.disk_images.scratch import counted, scratch_file, spool
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.storage import VolumeFacts
from pyrigaud.adapters.hypervisors.libvirt.volume_streams import VirStorageVol, volume_chunks
from pyrigaud.application.transfer_progress import TransferProgress
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError


@contextlib.contextmanager
def snapshot_disk(
    conn: VirConnect,
    disk: VolumeFacts,
    snapshot: str,
    *,
    backing: VirStorageVol | None,
    scratch_dir: str | None,
    progress: TransferProgress,
) -> Iterator[Iterator[bytes]]:
    """The raw disk of `disk` (a qcow2 volume) as internal snapshot `snapshot` holds it;
    `backing` is the raw flattened backing chain when the volume has one."""
    if disk.format != "qcow2":
        raise ExpectedError(
            ProviderError.failed_precondition(
                f"the disk {disk.path!r} is {disk.format}: only a qcow2 disk holds snapshots"
            )
        )
    with scratch_file(scratch_dir) as image:
        spool(counted(volume_chunks(conn, conn.storageVolLookupByPath(disk.path)), progress), image)
        raw_backing = volume_chunks(conn, backing) if backing is not None else None
        yield read_qcow2(image, field=fields.SNAPSHOT_ID, snapshot=snapshot, backing=raw_backing)
