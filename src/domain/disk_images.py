"""What a transfer knows of a disk image: its judged format, and the disk it landed as."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from enum import StrEnum

from pyrigaud.domain import fields
from pyrigaud.domain.chunks import Chunks, successes
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.hardware import BootNeed
from pyrigaud.domain.values import Value

# The header a converter reads first (a qcow2's, a sparse vmdk's).
HEADER_BYTES = 512
# How much of an image its judge sees before it names the format: every format's signature and
# header lie there (a vmdk's embedded descriptor, an ISO 9660 volume descriptor, vhdx's regions).
JUDGED_PREFIX_BYTES = 1024 * 1024
# Beside an imported disk, named after it: the import's record, for a retry to answer from.
IMPORT_RECORD_SUFFIX = ".pyrigaud-import.json"


class JudgedImage(Value):
    """An image's format as its bytes say: "qcow2", "vmdk" (a self-contained sparse extent)
    or "raw"; the size of the disk it holds; and whether it is a qcow2 a hypervisor may keep
    as the disk itself instead of converting it: plain (no internal snapshots, no
    incompatible feature: dirty, zstd, extended L2 entries), as qemu would make it, and with
    its tables checked by the judge as its bytes passed; and whether it is a streamOptimized
    vmdk (its grains compressed, with markers: what vCenter takes as it is), as its header
    says, so that no later step reads the header again. The whole image's verdict also says
    what firmware the disk can boot by, from the guest's first sectors as they passed."""

    format: str
    virtual_size_bytes: int = 0
    keepable_qcow2: bool = False
    stream_optimized_vmdk: bool = False
    boot: BootNeed = BootNeed.UNKNOWN


class LeftBehind(StrEnum):
    """What an export of one disk does not take along: the manager moves one disk, and a VM
    made from it elsewhere starts without these."""

    OTHER_DISKS = "other_disks"
    TPM = "tpm"
    NVRAM = "nvram"
    LATER_SNAPSHOTS = "later_snapshots"  # taken after the snapshot the disk is exported at


class LandedDisk(Value):
    """An imported disk: its path on the hypervisor, and whether this import made it (a retry
    may find the disk an earlier, killed import made)."""

    path: str
    made_now: bool = True


def name_clash(place: str, held: str) -> ProviderError:
    """ALREADY_EXISTS: the disk an import would make is already in `place` (`held` says what
    holds the name there) with other content. Every backend and ImportDisk refuse it so."""
    return ProviderError.about(
        ErrorKind.ALREADY_EXISTS,
        fields.TARGET_NAME,
        f"{place} already has {held} with other content; delete it or pick another "
        f"{fields.TARGET_NAME}",
        (fields.TARGET_NAME,),
    )


def peek_header(chunks: Iterable[bytes], count: int = HEADER_BYTES) -> tuple[bytes, Chunks[bytes]]:
    """The image's first `count` bytes (all of a shorter one) and the whole image, still to
    read (ending as `chunks` ends: its outcome is theirs): its format is judged before a
    byte is stored."""
    stream = iter(chunks)
    taken: list[bytes] = []
    size = 0
    while size < count and (chunk := next(stream, b"")):
        taken.append(chunk)
        size += len(chunk)
    whole = Chunks(successes(itertools.chain(taken, stream)), after=chunks)
    return b"".join(taken)[:count], whole
