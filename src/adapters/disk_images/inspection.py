"""The ImageJudge port by oslo.utils' format_inspector, the pure-Python inspector OpenStack runs
on every untrusted image (after CVE-2024-32498) before qemu-img may touch it.

Every inspector reads the bytes as they stream past; none of them allocates by what a header
claims. The format is named from the first JUDGED_PREFIX_BYTES (every format's signature and
header lie there), refusals that a header already shows are made then, before a byte is stored
as a disk, and the rest (a streamOptimized vmdk's footer and its grains, read whole as the
export reads them: `stream_optimized_grains.py`; the tables and compressed clusters of a qcow2 a
hypervisor may keep as it is: `qcow2_tables.py`) once the last byte passed. An image
is raw only when no other format's signature is in it: a partition table or an ISO 9660 volume
is a raw disk's content, as qemu reads it.

Accepted: raw, qcow2 (v2 and v3 with the features qemu knows: lazy refcounts, zlib or zstd
compression, extended L2 entries, internal snapshots) and the vmdk variants a single file holds
(monolithicSparse, streamOptimized). Refused by name: vhdx, vpc (vhd), vdi and qed (convert them
to qcow2 first), LUKS (encrypted), the formats qemu probes that format_inspector does not know
(parallels, bochs, cloop, VMware 3, a bare vmdk descriptor), a qcow2 with a backing file, an
external data file, encryption or the corrupt bit, a qcow2 whose header qemu would refuse at
open (`qcow2_header.py`), a vmdk naming other extent files, and any image whose virtual size
is above the bound or 0 (an empty disk, which no target holds alike: vCenter makes no file
for it).
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from returns.result import Failure, Result, Success

from pyrigaud.adapters.disk_images.blocks import SECTOR_BYTES
from pyrigaud.adapters.disk_images.first_sectors import FirstSectors
from pyrigaud.adapters.disk_images.qcow2_header import qcow2_header_problem
from pyrigaud.adapters.disk_images.qcow2_refcounts import countable_disk
from pyrigaud.adapters.disk_images.qcow2_tables import (
    QCOW2_DIRTY,
    QCOW2_EXTENDED_L2,
    QCOW2_FEATURES_OFFSET,
    QCOW2_LAYOUT_BYTES,
    Qcow2TableCheck,
    l2_table_inside_l1,
    tables_past_end,
)
from pyrigaud.adapters.disk_images.stream_optimized_grains import (
    StreamOptimizedCheck,
    is_stream_optimized,
    sparse_header_problem,
)
from pyrigaud.domain.boot_sectors import boot_need
from pyrigaud.domain.disk_images import JUDGED_PREFIX_BYTES, JudgedImage
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import BootNeed

if TYPE_CHECKING:
    from oslo_utils.imageutils.format_inspector import FileInspector

logger = logging.getLogger(__name__)

ACCEPTED = ("raw", "qcow2", "vmdk")
# Formats qemu reads but a migrated disk may not be staged as here, with what to do instead.
REFUSED = {
    "vhdx": "a vhdx image: convert it to qcow2 first",
    "vhd": "a vpc (vhd) image: convert it to qcow2 first",
    "vdi": "a vdi image: convert it to qcow2 first",
    "qed": "a qed image: convert it to qcow2 first",
    "luks": "a LUKS-encrypted image: decrypt it first (pyrigaud holds no keys)",
}
# What a raw disk may hold and still be read as raw by qemu.
RAW_CONTENT = frozenset({"raw", "gpt", "iso"})
# Signatures qemu's own format probes know and format_inspector does not: never raw.
OTHER_SIGNATURES = {
    b"WithoutFreeSpace": "a parallels image: convert it to qcow2 first",
    b"WithouFreSpacExt": "a parallels image: convert it to qcow2 first",
    b"# Disk DescriptorFile": "a vmdk descriptor, which names other extent files",
    b"COWD": "a VMware 3 vmdk (COWD): convert it to qcow2 first",
    b"Bochs Virtual HD Image": "a bochs image: convert it to qcow2 first",
    b"#!/bin/sh\n#V2.0 Format": "a cloop image: convert it to qcow2 first",
}
# The magic numbers of the formats format_inspector knows: an image that starts with one but
# that format's inspector does not take (cut short, malformed) is refused, never taken for raw.
MAGIC_NUMBERS = {
    b"QFI\xfb": "qcow2",
    b"KDMV": "vmdk",
    b"vhdxfile": "vhdx",
    b"conectix": "vpc",
    b"QED\x00": "qed",
    b"LUKS\xba\xbe": "luks",
}
VMDK_SUBFORMATS = ("monolithicsparse", "streamoptimized")
# qcow2's header (qemu's docs/interop/qcow2.txt); its feature bits are qcow2_tables.py's.
QCOW2_SNAPSHOTS_OFFSET = 60  # nb_snapshots: internal snapshots the image carries
QCOW2_CLUSTER_BITS_OFFSET = 20


class InspectingJudge:
    """Images of at most `max_virtual_bytes` (what the target can hold)."""

    def __init__(self, max_virtual_bytes: int) -> None:
        self._max_virtual_bytes = max_virtual_bytes

    def inspect(self, size_bytes: int | None, field: str) -> ImageInspection:
        return ImageInspection(self._max_virtual_bytes, size_bytes, field)


class ImageInspection:
    """One image's bytes, judged as they pass (`feed`)."""

    def __init__(self, max_virtual_bytes: int, size_bytes: int | None, field: str) -> None:
        self._max_virtual_bytes = max_virtual_bytes
        self._size_bytes = size_bytes
        self._field = field
        # Imported at the first import of a disk: it and its cryptography take memory a
        # provider that never imports one should not hold.
        from oslo_utils.imageutils import format_inspector  # noqa: PLC0415

        self._inspectors = {
            name: kind() for name, kind in format_inspector.ALL_FORMATS.items() if name != "raw"
        }
        self._fed = 0
        # The image's first JUDGED_PREFIX_BYTES, until the first look: its signature, and a
        # qcow2's header with its extensions.
        self._head: bytearray | None = bytearray()
        self._chosen: JudgedImage | None = None
        # A qcow2's tables, checked as they pass when it may be kept as it is (dropped at the
        # first look otherwise).
        self._tables: Qcow2TableCheck | None = Qcow2TableCheck()
        self._count_refcounts = True  # not a dirty qcow2's (qemu rebuilds them)
        # A streamOptimized vmdk's grains, read as they pass as the export reads them (dropped
        # at the first look for any other image).
        self._grains: StreamOptimizedCheck | None = StreamOptimizedCheck(field)
        # The guest's first sectors, for the firmware the disk can boot by.
        self._first_sectors = FirstSectors()
        # A qcow2's header, for where its tables end against the image's end.
        self._qcow2_head = b""

    def feed(self, chunk: bytes) -> None:
        """The next bytes; an inspector that finds they are not its format drops out."""
        if self._head is not None and len(self._head) < JUDGED_PREFIX_BYTES:
            self._head += chunk[: JUDGED_PREFIX_BYTES - len(self._head)]
        self._fed += len(chunk)
        self._first_sectors.feed(chunk)
        if self._tables is not None:
            self._tables.feed(chunk)
        if self._grains is not None:
            self._grains.feed(chunk)
        for name, inspector in list(self._inspectors.items()):
            try:
                inspector.eat_chunk(chunk)
            except Exception as error:
                logger.debug("not a %s image: %s", name, error)
                del self._inspectors[name]

    def first_look(self) -> Result[JudgedImage, ProviderError]:
        """The format, from the bytes fed so far (the first JUDGED_PREFIX_BYTES, or all of a
        shorter image), and what its header alone refuses."""
        if not self._fed:
            return self._refused("the image is empty")
        head = self._head if self._head is not None else bytearray()
        for signature, what in OTHER_SIGNATURES.items():
            if head.startswith(signature):
                return self._refused(f"the image is {what}")
        matched = sorted(
            name
            for name, inspector in self._inspectors.items()
            if name not in RAW_CONTENT and _matches(inspector)
        )
        if len(matched) > 1:
            return self._refused(f"the image carries the signatures of {', '.join(matched)}")
        if not matched:
            for magic, claimed in MAGIC_NUMBERS.items():
                if head.startswith(magic):
                    return self._refused(
                        f"the image starts as a {claimed} image but is not a whole one "
                        "(cut short or malformed)"
                    )
        name = matched[0] if matched else "raw"
        if name in REFUSED:
            return self._refused(f"the image is {REFUSED[name]}")
        # What follows needs only the chosen format's inspector (and a qcow2's table check).
        self._inspectors = {name: self._inspectors[name]} if name != "raw" else {}
        if name != "qcow2":
            self._tables = None
        judged = self._judged(name, bytes(head))
        match judged:
            case Success(chosen):
                self._chosen = chosen
                self._head = None
                if not chosen.stream_optimized_vmdk:
                    self._grains = None
        return judged

    def verdict(self) -> Result[JudgedImage, ProviderError]:
        """The whole image judged, once the last byte was fed (after `first_look`), with the
        firmware its guest's first sectors say it can boot by."""
        if self._chosen is None:
            return self.first_look()
        first_sectors = self._first_sectors.captured()
        boot = BootNeed.UNKNOWN if first_sectors is None else boot_need(first_sectors)
        if self._chosen.format == "raw":
            return Success(
                self._chosen.model_copy(update={"virtual_size_bytes": self._fed, "boot": boot})
            )
        chosen = self._chosen.model_copy(update={"boot": boot})
        inspector = self._inspectors[chosen.format]
        inspector.finish()
        problem = _unsafe(chosen.format, inspector)
        if problem is None and chosen.format == "qcow2":
            problem = tables_past_end(self._qcow2_head, self._fed)
        if problem is None and self._tables is not None:
            problem = self._tables.problem(count_refcounts=self._count_refcounts)
        if problem:
            return self._refused(problem)
        if chosen.stream_optimized_vmdk and self._grains is not None:
            refused = self._grains.refusal()
            if refused is not None:
                return Failure(refused)
        return Success(chosen)

    def _judged(self, name: str, head: bytes) -> Result[JudgedImage, ProviderError]:
        if name == "raw":
            virtual = self._size_bytes if self._size_bytes is not None else self._fed
            return self._bounded(JudgedImage(format="raw", virtual_size_bytes=virtual))
        inspector = self._inspectors[name]
        if name == "vmdk" and getattr(inspector, "vmdktype", "") not in VMDK_SUBFORMATS:
            return self._refused(
                "the vmdk is not a single file (monolithicSparse or streamOptimized): it "
                "names other extent files"
            )
        # A vmdk's footer is judged at the end; a qcow2's header is judged here as qemu does.
        problem = _unsafe(name, inspector) if inspector.complete else None
        if name == "qcow2" and problem is None:
            problem = qcow2_header_problem(head, whole=self._fed == len(head))
            problem = problem or l2_table_inside_l1(head)
            self._qcow2_head = head[:QCOW2_LAYOUT_BYTES]
        if name == "vmdk" and problem is None:
            problem = sparse_header_problem(bytes(inspector.region("header").data))
        if problem:
            return self._refused(problem)
        virtual = int(inspector.virtual_size)
        if name == "qcow2":  # qemu reads whole sectors of it
            virtual -= virtual % SECTOR_BYTES
        return self._bounded(
            JudgedImage(
                format=name,
                virtual_size_bytes=virtual,
                keepable_qcow2=name == "qcow2" and self._keeps_qcow2_as_is(inspector),
                stream_optimized_vmdk=name == "vmdk"
                and is_stream_optimized(bytes(inspector.region("header").data)),
            )
        )

    def _keeps_qcow2_as_is(self, inspector: FileInspector) -> bool:
        """A plain qcow2 (no internal snapshots, no incompatible feature) whose tables are
        checked as they pass and whose refcounts are counted (`countable_disk`). A dirty one's
        tables, and those of one with extended L2 entries, are checked alike, and the image
        converted; a dirty one's refcounts are not counted (they may be stale: qemu rebuilds
        them when it opens it for writing). The check is dropped for any other image (a
        conversion by qemu-img reads its tables)."""
        features = _qcow2_features(inspector)
        header = bytes(inspector.region("header").data)
        (cluster_bits,) = struct.unpack_from(">I", header, QCOW2_CLUSTER_BITS_OFFSET)
        checked = (
            features is not None
            and features & ~(QCOW2_DIRTY | QCOW2_EXTENDED_L2) == 0
            and self._tables is not None
            and self._tables.watching
            and countable_disk(int(inspector.virtual_size), self._size_bytes, cluster_bits)
        )
        if not checked:
            self._tables = None
        self._count_refcounts = features is not None and not features & QCOW2_DIRTY
        return checked and features == 0

    def _bounded(self, image: JudgedImage) -> Result[JudgedImage, ProviderError]:
        if image.virtual_size_bytes == 0:
            return self._refused("the image holds an empty disk (virtual size 0)")
        if image.virtual_size_bytes > self._max_virtual_bytes:
            return self._refused(
                f"the {image.format} image claims a virtual size of "
                f"{image.virtual_size_bytes} bytes, above the {self._max_virtual_bytes} "
                "this provider accepts (PYRIGAUD_MAX_IMAGE_VIRTUAL_GIB)"
            )
        return Success(image)

    def _refused(self, problem: str) -> Result[JudgedImage, ProviderError]:
        return Failure(ProviderError.invalid_spec(self._field, problem))


def _matches(inspector: FileInspector) -> bool:
    try:
        return bool(inspector.format_match)
    except Exception:
        return False


def _qcow2_features(inspector: FileInspector) -> int | None:
    """A qcow2's incompatible feature bits (none in a version 2 image), or None for one with
    internal snapshots."""
    header = bytes(inspector.region("header").data)
    (version,) = struct.unpack_from(">I", header, 4)
    (snapshots,) = struct.unpack_from(">I", header, QCOW2_SNAPSHOTS_OFFSET)
    if snapshots:
        return None
    if version == 2:
        return 0
    (features,) = struct.unpack_from(">Q", header, QCOW2_FEATURES_OFFSET)
    return int(features)


def _unsafe(name: str, inspector: FileInspector) -> str | None:
    """What format_inspector's safety checks of the format find (a qcow2's unknown-features
    check is `qcow2_header_problem`'s: it knows extended L2 entries), or None."""
    from oslo_utils.imageutils import format_inspector  # noqa: PLC0415 - loaded by now

    try:
        inspector.safety_check()
    except format_inspector.SafetyCheckFailed as failed:
        reasons = {
            check: str(error)
            for check, error in failed.failures.items()
            if not (name == "qcow2" and check == "unknown_features")
        }
        if reasons:
            return f"the {name} image is unsafe: {'; '.join(reasons.values())}"
    except format_inspector.ImageFormatError as error:
        return f"the {name} image is malformed: {error}"
    return None
