"""What firmware a disk can boot by, judged from its first sectors alone.

The VMClass CRD defaults `firmware` to BIOS, so the manager asks for BIOS even when nobody
chose it, and a guest installed for UEFI does not boot by BIOS. The disk itself tells: a disk
that only UEFI can boot carries a GPT with an EFI System Partition and nothing a BIOS could
run. Judged from the bytes alone, so that it works for any disk (one exported by pyrigaud or
one from an upstream source), and erring on BIOS: BIOS keeps the class's firmware, as before,
while a wrong UEFI_ONLY would make a disk that booted unbootable.

The rule (`boot_need`):

- BIOS when LBA 0 ends in the 0x55AA boot signature and its 440-byte boot code area holds any
  non-zero byte (syslinux's mbr.bin and gptmbr.bin, GRUB's boot.img, Windows' MBR code: a
  BIOS runs whatever is there, so any code counts), or when a valid GPT holds a BIOS boot
  partition (where GRUB keeps its core image on a GPT disk);
- UEFI_ONLY when LBA 0 is a protective MBR (the signature, a partition of type 0xEE, a boot
  code area all zero) and a valid GPT holds an EFI System Partition;
- UNKNOWN otherwise: too few bytes, no signature, a partition table with nothing to boot by
  either, a GPT whose header or entry array fails its CRC32 or lies beyond the bytes given.

A valid GPT: the header "EFI PART" at LBA 1 (of 512-byte sectors, or of 4096-byte sectors when
LBA 1 of 512 bytes holds none), its size 92 bytes to a sector, its CRC32 right, its own LBA 1,
its entry array of at most FIRST_SECTORS_BYTES at an LBA of 2 or more, entries of 128 bytes
times a power of two, and the array's CRC32 right. Every length is bounded before it is used:
no bytes make this raise or allocate by what they claim.
"""

from __future__ import annotations

import struct
import uuid
import zlib

from pyrigaud.domain.hardware import BootNeed

# What the judge reads: LBA 0 to 33 of 512-byte sectors are 17 KiB; a GPT of 4096-byte
# sectors has its 16 KiB entry array at 8 KiB. 64 KiB covers both with room for larger arrays.
FIRST_SECTORS_BYTES = 64 * 1024
MBR_BYTES = 512
BOOT_CODE_BYTES = 440  # then the disk signature, two reserved bytes and the partition table
_PARTITION_TABLE_OFFSET = 446
_PARTITION_ENTRY_BYTES = 16
_PARTITION_TYPE_OFFSET = 4
_BOOT_SIGNATURE = b"\x55\xaa"
GPT_PROTECTIVE_TYPE = 0xEE
SECTOR_SIZES = (512, 4096)
GPT_SIGNATURE = b"EFI PART"
# The GPT header to the entry array's CRC32 (UEFI 2.10, 5.3.2): signature, revision, header
# size, header CRC32, reserved, my LBA, alternate LBA, first and last usable LBA, disk GUID,
# partition entry LBA, number of entries, size of an entry, entry array CRC32.
_GPT_HEADER = struct.Struct("<8sIII4xQQQQ16sQIII")
_GPT_HEADER_CRC_OFFSET = 16
_MIN_ENTRY_BYTES = 128
# Partition type GUIDs, as they lie on the disk (mixed-endian, UEFI's EFI_GUID).
EFI_SYSTEM_PARTITION = uuid.UUID("C12A7328-F81F-11D2-BA4B-00A0C93EC93B").bytes_le
BIOS_BOOT_PARTITION = uuid.UUID("21686148-6449-6E6F-744E-656564454649").bytes_le
_UNUSED_ENTRY = bytes(16)


def boot_need(first_sectors: bytes) -> BootNeed:
    """What firmware the disk whose first bytes these are can boot by (the module's rule).
    Only the first FIRST_SECTORS_BYTES are read."""
    sectors = memoryview(first_sectors)[:FIRST_SECTORS_BYTES]
    if len(sectors) < MBR_BYTES or bytes(sectors[510:512]) != _BOOT_SIGNATURE:
        return BootNeed.UNKNOWN
    if any(sectors[:BOOT_CODE_BYTES]):
        return BootNeed.BIOS
    if not _is_protective_mbr(sectors):
        return BootNeed.UNKNOWN
    types = _gpt_partition_types(sectors)
    if types is None:
        return BootNeed.UNKNOWN
    if BIOS_BOOT_PARTITION in types:
        return BootNeed.BIOS
    if EFI_SYSTEM_PARTITION in types:
        return BootNeed.UEFI_ONLY
    return BootNeed.UNKNOWN


def _is_protective_mbr(sectors: memoryview) -> bool:
    """Whether one of the MBR's four partitions is of type 0xEE (a GPT's protective one; a
    hybrid MBR adds others beside it)."""
    return any(
        sectors[_PARTITION_TABLE_OFFSET + index * _PARTITION_ENTRY_BYTES + _PARTITION_TYPE_OFFSET]
        == GPT_PROTECTIVE_TYPE
        for index in range(4)
    )


def _gpt_partition_types(sectors: memoryview) -> set[bytes] | None:
    """The type GUIDs of the GPT's partitions (as they lie on the disk), or None when no valid
    GPT lies within the bytes: the header at LBA 1 of 512-byte sectors, else of 4096-byte."""
    for sector_bytes in SECTOR_SIZES:
        types = _partition_types_at(sectors, sector_bytes)
        if types is not None:
            return types
    return None


def _partition_types_at(sectors: memoryview, sector_bytes: int) -> set[bytes] | None:
    header = bytes(sectors[sector_bytes : sector_bytes * 2])
    if len(header) < _GPT_HEADER.size or not header.startswith(GPT_SIGNATURE):
        return None
    (_, _, header_bytes, header_crc, my_lba, _, _, _, _, entries_lba, count, entry_bytes, crc) = (
        _GPT_HEADER.unpack_from(header)
    )
    if not _GPT_HEADER.size <= header_bytes <= len(header) or my_lba != 1:
        return None
    zeroed = bytearray(header[:header_bytes])
    zeroed[_GPT_HEADER_CRC_OFFSET : _GPT_HEADER_CRC_OFFSET + 4] = bytes(4)
    if zlib.crc32(zeroed) != header_crc:
        return None
    if entry_bytes < _MIN_ENTRY_BYTES or entry_bytes & (entry_bytes - 1) or entries_lba < 2:
        return None
    start = entries_lba * sector_bytes
    end = start + count * entry_bytes
    if end > len(sectors):  # also bounds count: the array lies within FIRST_SECTORS_BYTES
        return None
    entries = sectors[start:end]
    if zlib.crc32(entries) != crc:
        return None
    return {
        bytes(entries[offset : offset + 16]) for offset in range(0, len(entries), entry_bytes)
    } - {_UNUSED_ENTRY}
