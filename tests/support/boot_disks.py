"""Small disks partitioned by the field's own tools (util-linux's sfdisk and fdisk, syslinux),
for judging what firmware a disk boots by."""

from __future__ import annotations

import subprocess
from pathlib import Path

ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
BIOS_BOOT_TYPE = "21686148-6449-6E6F-744E-656564454649"
LINUX_TYPE = "0FC63DAF-8483-4772-8E79-3D69ED47DE8E"
SYSLINUX_MBR = Path("/usr/lib/syslinux/mbr/mbr.bin")
SYSLINUX_GPT_MBR = Path("/usr/lib/syslinux/mbr/gptmbr.bin")
DISK_BYTES = 16 * 1024 * 1024
BOOT_CODE_BYTES = 440


def _run(command: list[str], stdin: str = "") -> None:
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"


def empty_disk(path: Path) -> Path:
    with path.open("wb") as file:
        file.truncate(DISK_BYTES)
    return path


def sfdisk(path: Path, script: str) -> Path:
    """A disk partitioned by sfdisk from `script` (its input format)."""
    empty_disk(path)
    _run(["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", str(path)], script)
    return path


def gpt_disk(path: Path, *types: str) -> Path:
    """A GPT disk (512-byte sectors) with one 2 MiB partition of each type, in order, and no
    boot code in its protective MBR (sfdisk writes none)."""
    partitions = "".join(f"size=2MiB, type={kind}\n" for kind in types)
    return sfdisk(path, f"label: gpt\n{partitions}")


def uefi_only_disk(path: Path) -> Path:
    """What an installer for UEFI makes: an EFI System Partition and a root, no BIOS code."""
    return gpt_disk(path, ESP_TYPE, LINUX_TYPE)


def with_boot_code(path: Path, code: Path) -> Path:
    """The disk with `code`'s first 440 bytes as its MBR boot code (what syslinux's and
    GRUB's installers write there), its partition table untouched."""
    with path.open("r+b") as file:
        file.write(code.read_bytes()[:BOOT_CODE_BYTES])
    return path


def syslinux_mbr_disk(path: Path) -> Path:
    """A BIOS disk as this project's test guest is made: an MBR with one active FAT16
    partition, syslinux installed in it and syslinux's MBR code in LBA 0."""
    start_sector = 2048
    sfdisk(path, f"start={start_sector}, type=6, bootable\n")
    offset = str(start_sector * 512)
    _run(["mkfs.fat", "-F", "16", "--offset", str(start_sector), str(path)])
    _run(["syslinux", "--install", "--offset", offset, str(path)])
    return with_boot_code(path, SYSLINUX_MBR)


def gpt_4k_disk(path: Path) -> Path:
    """A GPT of 4096-byte sectors (fdisk told the sector size): an EFI System Partition and
    a Linux one; its header at byte 4096, its entries at 8 KiB."""
    empty_disk(path)
    # g: a new GPT; n: a 4 MiB partition 1, t: of type 1 (EFI System); n: partition 2 with
    # the rest; w: write.
    _run(["fdisk", "-b", "4096", str(path)], "g\nn\n1\n\n+4M\nt\n1\nn\n2\n\n\nw\n")
    return path


def first_bytes(path: Path, count: int) -> bytes:
    with path.open("rb") as file:
        return file.read(count)
