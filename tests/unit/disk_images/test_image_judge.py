"""The staged image judge (format_inspector) on images the real qemu-img makes: the formats a
disk may be staged in are named, every other image is refused by name, and bounds hold."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from pyrigaud.adapters.disk_images.inspection import InspectingJudge
from pyrigaud.adapters.disk_images.scratch import scratch_file
from pyrigaud.adapters.disk_images.stream_optimized import encode_stream_optimized
from pyrigaud.domain.disk_images import JUDGED_PREFIX_BYTES, JudgedImage
from pyrigaud.domain.errors import ErrorKind

from support import error_of, ok
from support.disk_image import MIB, qemu_img
from support.judging import BOUND, judged

TIB = 1024**4
SIZE = "3M"


def made(tmp_path: Path, disk_format: str, *options: str, size: str = SIZE) -> Path:
    image = tmp_path / f"image.{disk_format}"
    qemu_img("create", "-f", disk_format, *options, image, size)
    return image


def with_data(tmp_path: Path, disk_format: str, *options: str) -> Path:
    """A 3 MiB disk with data in its first and last clusters, converted to the format."""
    raw = tmp_path / "source.raw"
    raw.write_bytes(os.urandom(64 * 1024) + bytes(3 * MIB - 128 * 1024) + os.urandom(64 * 1024))
    image = tmp_path / f"image.{disk_format}"
    qemu_img("convert", "-O", disk_format, *options, raw, image)
    return image


@pytest.mark.parametrize(
    ("disk_format", "options"),
    [
        ("qcow2", ["-o", "compat=0.10"]),
        ("qcow2", []),
        ("qcow2", ["-o", "lazy_refcounts=on"]),
        ("qcow2", ["-o", "compression_type=zstd", "-c"]),
        ("qcow2", ["-o", "compression_type=zlib", "-c"]),
        ("qcow2", ["-o", "extended_l2=on,cluster_size=128k"]),
        ("qcow2", ["-o", "cluster_size=2M"]),
        ("vmdk", []),  # monolithicSparse, VMware Workstation's own
        ("vmdk", ["-o", "subformat=streamOptimized"]),
        ("raw", []),
    ],
)
def test_the_formats_a_disk_may_be_staged_in_are_named(
    tmp_path: Path, disk_format: str, options: list[str]
) -> None:
    image = ok(judged(with_data(tmp_path, disk_format, *options)))
    assert image.format == disk_format
    assert image.virtual_size_bytes == 3 * MIB


@pytest.mark.parametrize(
    ("disk_format", "options", "keepable"),
    [
        ("qcow2", ["-o", "compat=0.10"], True),
        ("qcow2", [], True),
        ("qcow2", ["-o", "lazy_refcounts=on"], True),  # a compatible feature
        ("qcow2", ["-o", "compression_type=zlib", "-c"], True),
        ("qcow2", ["-o", "compression_type=zstd", "-c"], False),  # an incompatible feature
        ("qcow2", ["-o", "extended_l2=on,cluster_size=128k"], False),
        # Plain, but its L1 table (its fourth cluster) ends past the bytes the judge holds:
        # its tables could not be checked as they passed.
        ("qcow2", ["-o", "cluster_size=2M"], False),
        ("vmdk", [], False),
        ("raw", [], False),
    ],
)
def test_a_qcow2_kept_as_it_is_is_plain_and_its_tables_watched(
    tmp_path: Path, disk_format: str, options: list[str], keepable: bool
) -> None:
    assert ok(judged(with_data(tmp_path, disk_format, *options))).keepable_qcow2 is keepable


@pytest.mark.parametrize(
    ("disk_format", "options", "stream_optimized"),
    [
        ("vmdk", ["-o", "subformat=streamOptimized"], True),
        ("vmdk", [], False),  # monolithicSparse
        ("qcow2", [], False),
        ("raw", [], False),
    ],
)
def test_the_verdict_says_whether_the_image_is_a_stream_optimized_vmdk(
    tmp_path: Path, disk_format: str, options: list[str], stream_optimized: bool
) -> None:
    image = ok(judged(with_data(tmp_path, disk_format, *options)))
    assert image.stream_optimized_vmdk is stream_optimized


def test_a_qcow2_with_internal_snapshots_is_a_qcow2_but_not_one_kept_as_it_is(
    tmp_path: Path,
) -> None:
    image = with_data(tmp_path, "qcow2")
    qemu_img("snapshot", "-c", "before", image)
    judged_image = ok(judged(image))
    assert judged_image.format == "qcow2"
    assert not judged_image.keepable_qcow2


def test_a_qcow2_kept_as_it_is_whose_l2_table_qemu_refuses_passes_the_first_look_only(
    tmp_path: Path,
) -> None:
    """Its header is sound, so the first look passes it; the verdict, once its last byte
    passed, names the L2 entry (the last cluster's) that qemu refuses as corrupt."""
    image = with_data(tmp_path, "qcow2")
    content = bytearray(image.read_bytes())
    (l1_offset,) = struct.unpack_from(">Q", content, 40)
    (l2_offset,) = struct.unpack_from(">Q", content, l1_offset)
    l2_offset &= 0x00FFFFFFFFFFFE00
    last = l2_offset + (3 * MIB // (64 * 1024) - 1) * 8
    (entry,) = struct.unpack_from(">Q", content, last)
    assert entry
    struct.pack_into(">Q", content, last, entry + 512)
    image.write_bytes(bytes(content))
    inspection = InspectingJudge(BOUND).inspect(len(content), "source_url")
    inspection.feed(bytes(content[:JUDGED_PREFIX_BYTES]))
    assert ok(inspection.first_look()).keepable_qcow2
    inspection.feed(bytes(content[JUDGED_PREFIX_BYTES:]))
    refused = error_of(inspection.verdict())
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert "places a data cluster off a cluster boundary" in refused.message
    assert "source_url" in refused.message


def test_a_raw_disk_with_a_partition_table_is_raw(tmp_path: Path) -> None:
    """A GPT (behind its protective MBR) is a raw disk's content, as qemu reads it."""
    disk = bytearray(3 * MIB)
    disk[446 + 4] = 0xEE  # the protective MBR's one partition
    disk[510:512] = b"\x55\xaa"
    disk[512:520] = b"EFI PART"
    image = tmp_path / "gpt.raw"
    image.write_bytes(bytes(disk))
    assert ok(judged(image)) == JudgedImage(format="raw", virtual_size_bytes=3 * MIB)


@pytest.mark.parametrize(
    ("disk_format", "options", "named"),
    [
        ("vhdx", [], "vhdx image"),
        ("vpc", [], "vpc (vhd) image"),
        ("vdi", [], "vdi image"),
        ("qed", [], "qed image"),
        ("vmdk", ["-o", "subformat=twoGbMaxExtentSparse"], "names other extent files"),
        ("vmdk", ["-o", "subformat=monolithicFlat"], "names other extent files"),
        ("parallels", [], "parallels image"),
        ("qcow", [], "qcow version 1 image"),
    ],
)
def test_other_formats_are_refused_by_name(
    tmp_path: Path, disk_format: str, options: list[str], named: str
) -> None:
    refused = error_of(judged(made(tmp_path, disk_format, *options)))
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert refused.message.startswith("source_url: ")
    assert named in refused.message


def test_a_bare_vmdk_descriptor_is_refused_even_without_a_create_type(tmp_path: Path) -> None:
    """qemu probes the descriptor's first line: it is never a raw disk of those bytes."""
    image = tmp_path / "descriptor.vmdk"
    image.write_bytes(b'# Disk DescriptorFile\nRW 8 SPARSE "/etc/shadow"\n')
    assert "vmdk descriptor" in error_of(judged(image)).message


def test_an_encrypted_image_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "secret.luks"
    qemu_img(
        *("create", "--object", "secret,id=key,data=hunter2", "-f", "luks"),
        *("-o", "key-secret=key,iter-time=500", image, SIZE),
    )
    assert "LUKS-encrypted" in error_of(judged(image)).message


def test_an_encrypted_qcow2_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "secret.qcow2"
    qemu_img(
        *("create", "--object", "secret,id=key,data=hunter2", "-f", "qcow2"),
        *("-o", "encrypt.format=luks,encrypt.key-secret=key,encrypt.iter-time=500", image, SIZE),
    )
    assert "encrypted" in error_of(judged(image)).message


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["-b", "{dir}/base", "-F", "raw"], "backing file"),
        (["-o", "data_file={dir}/data"], "data_file"),
    ],
)
def test_a_qcow2_naming_another_file_is_refused(
    tmp_path: Path, options: list[str], problem: str
) -> None:
    qemu_img("create", "-f", "raw", tmp_path / "base", SIZE)
    image = made(tmp_path, "qcow2", *(part.format(dir=tmp_path) for part in options))
    assert problem in error_of(judged(image)).message


def test_a_qcow2_marked_corrupt_is_refused(tmp_path: Path) -> None:
    image = with_data(tmp_path, "qcow2")
    header = bytearray(image.read_bytes())
    header[79] |= 1 << 1  # the corrupt bit of the incompatible features
    image.write_bytes(bytes(header))
    assert "marked corrupt" in error_of(judged(image)).message


@pytest.mark.parametrize(
    ("offset", "change", "qemu_says", "problem"),
    [
        (40, 8, "Active L1 table offset invalid", "L1 table does not start on a cluster"),
        (48, 512, "Reference count table offset invalid", "refcount table does not start on"),
        (36, -1, "L1 table is too small", "L1 table is too small for its disk"),  # l1_size
        (36, 2**30, "Active L1 table too large", "L1 table is larger than qemu reads"),
        (20, 10, "Unsupported cluster size", "clusters are 2^22 bytes; qemu reads"),  # 4 KiB: 2^12
        (20, 2**32 - 13, "Unsupported cluster size", "clusters are 2^4294967295 bytes"),
        (20, -4, "Unsupported cluster size", "clusters are 2^8 bytes"),
    ],
)
def test_a_qcow2_whose_tables_qemu_refuses_at_open_is_refused(
    tmp_path: Path, offset: int, change: int, qemu_says: str, problem: str
) -> None:
    image = with_data(tmp_path, "qcow2", "-o", "cluster_size=4k")  # an L1 of several entries
    content = bytearray(image.read_bytes())
    width = ">I" if offset in {20, 36} else ">Q"  # cluster_bits and l1_size are 32-bit
    (value,) = struct.unpack_from(width, content, offset)
    struct.pack_into(width, content, offset, value + change)
    image.write_bytes(bytes(content))
    opened = subprocess.run(
        ["qemu-img", "info", str(image)], check=False, capture_output=True, text=True
    )
    assert qemu_says in opened.stderr  # qemu refuses it too
    assert problem in error_of(judged(image)).message


def test_a_virtual_size_above_the_bound_is_refused_before_the_rest_is_read(
    tmp_path: Path,
) -> None:
    image = made(tmp_path, "qcow2", size="100T")  # a few hundred KiB claiming 100 TiB
    inspection = InspectingJudge(BOUND).inspect(image.stat().st_size, "source_url")
    with image.open("rb") as file:
        inspection.feed(file.read(JUDGED_PREFIX_BYTES))
    refused = error_of(inspection.first_look())
    assert "virtual size of 109951162777600 bytes" in refused.message
    assert "PYRIGAUD_MAX_IMAGE_VIRTUAL_GIB" in refused.message


def test_a_raw_image_larger_than_the_bound_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "disk.raw"
    image.write_bytes(os.urandom(4096))
    assert "virtual size" in error_of(judged(image, bound=1024)).message


def test_a_stream_optimized_vmdk_cut_short_is_refused_at_the_end(tmp_path: Path) -> None:
    """As vCenter's exports stream them: the grain directory after the data, the header
    saying so and a footer repeating it, which the cut took away."""
    disk = os.urandom(MIB) + bytes(2 * MIB)
    whole = b"".join(encode_stream_optimized([disk], len(disk)))
    image = tmp_path / "cut.vmdk"
    image.write_bytes(whole[: -3 * 512])
    assert "vmdk image is unsafe" in error_of(judged(image)).message


def test_an_empty_image_is_refused(tmp_path: Path) -> None:
    image = tmp_path / "empty"
    image.write_bytes(b"")
    assert "empty" in error_of(judged(image)).message


@pytest.mark.parametrize(
    ("disk_format", "options"),
    [
        ("qcow2", ()),
        ("vmdk", ("-o", "subformat=monolithicSparse")),
        ("vmdk", ("-o", "subformat=streamOptimized")),
    ],
)
def test_an_image_of_virtual_size_0_is_refused_by_name(
    tmp_path: Path, disk_format: str, options: tuple[str, ...]
) -> None:
    """qemu-img makes and reads such an image, but it holds no disk a target could take alike
    (vCenter makes no file for it): refused at the first look, as bad input."""
    image = made(tmp_path, disk_format, *options, size="0")
    refused = error_of(judged(image))
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert refused.message == "source_url: the image holds an empty disk (virtual size 0)"


def test_scratch_file_leaves_no_name_and_closes(tmp_path: Path) -> None:
    with scratch_file(str(tmp_path)) as file:
        file.write(b"scratch")
        file.seek(0)
        assert file.read() == b"scratch"
        assert os.listdir(tmp_path) == []  # unlinked at once: a killed provider leaves nothing
    assert file.closed
