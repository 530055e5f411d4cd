"""The firmware a disk boots by, judged from its first sectors: disks partitioned by sfdisk,
fdisk and syslinux as installers leave them, the same bent, and hostile bytes."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrigaud.domain.boot_sectors import FIRST_SECTORS_BYTES, boot_need
from pyrigaud.domain.hardware import BootNeed

from support.boot_disks import (
    BIOS_BOOT_TYPE,
    ESP_TYPE,
    LINUX_TYPE,
    SYSLINUX_GPT_MBR,
    empty_disk,
    first_bytes,
    gpt_4k_disk,
    gpt_disk,
    sfdisk,
    syslinux_mbr_disk,
    uefi_only_disk,
    with_boot_code,
)

_HEADER_CRC = 16


def judged(path: Path, count: int = FIRST_SECTORS_BYTES) -> BootNeed:
    return boot_need(first_bytes(path, count))


def test_a_gpt_with_an_esp_and_no_boot_code_boots_only_by_uefi(tmp_path: Path) -> None:
    assert judged(uefi_only_disk(tmp_path / "disk")) is BootNeed.UEFI_ONLY


def test_the_gpt_of_a_disk_of_4096_byte_sectors_is_read_at_4096(tmp_path: Path) -> None:
    disk = gpt_4k_disk(tmp_path / "disk")
    assert first_bytes(disk, 4104)[4096:] == b"EFI PART"
    assert judged(disk) is BootNeed.UEFI_ONLY


def test_a_bios_boot_partition_and_boot_code_boot_by_bios(tmp_path: Path) -> None:
    disk = gpt_disk(tmp_path / "disk", BIOS_BOOT_TYPE, ESP_TYPE, LINUX_TYPE)
    assert judged(with_boot_code(disk, SYSLINUX_GPT_MBR)) is BootNeed.BIOS


def test_a_bios_boot_partition_alone_boots_by_bios(tmp_path: Path) -> None:
    disk = gpt_disk(tmp_path / "disk", BIOS_BOOT_TYPE, ESP_TYPE, LINUX_TYPE)
    assert judged(disk) is BootNeed.BIOS


def test_boot_code_in_a_protective_mbr_boots_by_bios(tmp_path: Path) -> None:
    disk = with_boot_code(uefi_only_disk(tmp_path / "disk"), SYSLINUX_GPT_MBR)
    assert judged(disk) is BootNeed.BIOS


def test_an_mbr_disk_made_by_syslinux_boots_by_bios(tmp_path: Path) -> None:
    assert judged(syslinux_mbr_disk(tmp_path / "disk")) is BootNeed.BIOS


def test_an_mbr_without_boot_code_is_unknown(tmp_path: Path) -> None:
    disk = sfdisk(tmp_path / "disk", "type=83\n")
    assert judged(disk) is BootNeed.UNKNOWN


def test_a_gpt_without_an_esp_is_unknown(tmp_path: Path) -> None:
    assert judged(gpt_disk(tmp_path / "disk", LINUX_TYPE)) is BootNeed.UNKNOWN


def test_an_empty_disk_and_random_bytes_are_unknown(tmp_path: Path) -> None:
    assert judged(empty_disk(tmp_path / "disk")) is BootNeed.UNKNOWN
    noise = random.Random(40).randbytes(FIRST_SECTORS_BYTES)
    assert noise[510:512] != b"\x55\xaa"
    assert boot_need(noise) is BootNeed.UNKNOWN
    assert boot_need(b"") is BootNeed.UNKNOWN


def test_a_gpt_whose_entries_were_not_given_is_unknown(tmp_path: Path) -> None:
    disk = uefi_only_disk(tmp_path / "disk")
    assert judged(disk, 17 * 1024) is BootNeed.UEFI_ONLY  # LBA 0 to 33
    assert judged(disk, 17 * 1024 - 1) is BootNeed.UNKNOWN
    assert judged(disk, 1024) is BootNeed.UNKNOWN


@pytest.mark.parametrize(
    ("offset", "what"),
    [(512 + 20, "the header's own bytes"), (1024 + 40, "a partition entry")],
)
def test_a_gpt_failing_its_crc_is_unknown(tmp_path: Path, offset: int, what: str) -> None:
    sectors = bytearray(first_bytes(uefi_only_disk(tmp_path / "disk"), FIRST_SECTORS_BYTES))
    sectors[offset] ^= 0xFF
    assert boot_need(bytes(sectors)) is BootNeed.UNKNOWN, what


@pytest.fixture(scope="module")
def gpt_sectors(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    disk = uefi_only_disk(tmp_path_factory.mktemp("gpt") / "disk")
    return first_bytes(disk, FIRST_SECTORS_BYTES)


def resealed(header: bytearray) -> bytes:
    """The header with its CRC32 made right again, over the size it claims (bounded)."""
    (size,) = struct.unpack_from("<I", header, 12)
    covered = bytearray(header[: min(size, len(header))])
    covered[_HEADER_CRC : _HEADER_CRC + 4] = bytes(4)
    struct.pack_into("<I", header, _HEADER_CRC, zlib.crc32(covered))
    return bytes(header)


# The header's fields an attacker bends (offset, format): its size, its LBA, the entries'
# LBA, their count and size.
_BENT_FIELDS = st.sampled_from([(12, "<I"), (24, "<Q"), (72, "<Q"), (80, "<I"), (84, "<I")])


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=_BENT_FIELDS, value=st.integers(min_value=0, max_value=2**32 - 1))
def test_hostile_gpt_headers_are_judged_without_raising(
    gpt_sectors: bytes, field: tuple[int, str], value: int
) -> None:
    offset, layout = field
    sectors = bytearray(gpt_sectors)
    header = bytearray(sectors[512:1024])
    struct.pack_into(layout, header, offset, value)
    sectors[512:1024] = resealed(header)
    assert boot_need(bytes(sectors)) in set(BootNeed)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2048), tail=st.sampled_from([b"", b"\x55\xaa"]))
def test_arbitrary_bytes_are_judged_without_raising(data: bytes, tail: bytes) -> None:
    sectors = data[:510].ljust(510, b"\0") + tail + data[510:] if tail else data
    assert boot_need(sectors) in set(BootNeed)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.integers(min_value=0, max_value=17 * 1024 - 1), byte=st.integers(0, 255))
def test_a_gpt_bent_anywhere_is_judged_without_raising(
    gpt_sectors: bytes, position: int, byte: int
) -> None:
    sectors = bytearray(gpt_sectors)
    sectors[position] = byte
    assert boot_need(bytes(sectors)) in set(BootNeed)
