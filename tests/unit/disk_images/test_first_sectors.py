"""The guest's first sectors captured from an image's bytes as they stream past: what qemu
reads at offset 0 of images qemu-img and this project's writers make, however the bytes are
cut into chunks; None where the bytes cannot tell; hostile bytes never raise."""

from __future__ import annotations

import json
import random
import struct
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from returns.result import Success

from pyrigaud.adapters.disk_images.first_sectors import WINDOW_BYTES, FirstSectors
from pyrigaud.adapters.disk_images.qcow2 import write_qcow2
from pyrigaud.adapters.disk_images.stream_optimized import encode_stream_optimized
from pyrigaud.domain.boot_sectors import FIRST_SECTORS_BYTES, boot_need
from pyrigaud.domain.hardware import BootNeed

from support import ok
from support.boot_disks import uefi_only_disk
from support.disk_image import MIB, chunked, file_chunks, qemu_img
from support.image_corpus import HOSTILE, VALID, hostile_image, oracle_raw, valid_image

# Whole (4 MiB chunks, as the transfers read), a cluster and 3 bytes, and 4099 bytes.
CHUNKINGS = (4 * MIB, 65536 + 3, 4099)
CLUSTER = 65536
# Each image made from the UEFI-only disk: qemu-img's format and options.
CONVERTED = {
    "raw": ("raw", ()),
    "qcow2": ("qcow2", ()),
    "qcow2-v2": ("qcow2", ("-o", "compat=0.10")),
    "qcow2-compressed": ("qcow2", ("-c",)),
    "qcow2-compressed-4k-clusters": ("qcow2", ("-c", "-o", "cluster_size=4k")),
    "qcow2-512-byte-clusters": ("qcow2", ("-o", "cluster_size=512")),
    "qcow2-2-mib-clusters": ("qcow2", ("-o", "cluster_size=2M")),
    "qcow2-extended-l2": ("qcow2", ("-o", "extended_l2=on,cluster_size=128k")),
    "vmdk-stream-optimized": ("vmdk", ("-o", "subformat=streamOptimized")),
    "vmdk-monolithic-sparse": ("vmdk", ("-o", "subformat=monolithicSparse")),
}


def captured(chunks: Iterable[bytes]) -> bytes | None:
    capture = FirstSectors()
    for chunk in chunks:
        capture.feed(chunk)
    return capture.captured()


def captured_from(path: Path, chunk_bytes: int = CHUNKINGS[0]) -> bytes | None:
    return captured(file_chunks(path, chunk_bytes))


def qemu_reads_at_zero(path: Path, disk_format: str) -> bytes:
    """What qemu reads of the guest's first FIRST_SECTORS_BYTES (fewer on a smaller disk)."""
    out = path.with_name(path.name + ".first")
    qemu_img(
        "dd", "-f", disk_format, "-O", "raw", f"bs={FIRST_SECTORS_BYTES}", "count=1",
        f"if={path}", f"of={out}",
    )  # fmt: skip
    return out.read_bytes()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("first-sectors")


@pytest.fixture(scope="module")
def uefi_disk(workdir: Path) -> Path:
    """A UEFI-only GPT disk whose first 64 KiB hold more than the GPT: random bytes from
    20 KiB on (so every cluster of them matters), and more data further on."""
    disk = uefi_only_disk(workdir / "uefi.raw")
    noise = random.Random(40)
    with disk.open("r+b") as file:
        file.seek(20 * 1024)
        file.write(noise.randbytes(FIRST_SECTORS_BYTES - 20 * 1024))
        file.seek(3 * MIB + 5)
        file.write(noise.randbytes(300_000))
    return disk


def converted(source: Path, name: str, workdir: Path) -> Path:
    disk_format, options = CONVERTED[name]
    image = workdir / f"{name}.{disk_format}"
    if not image.exists():
        qemu_img("convert", "-f", "raw", "-O", disk_format, *options, source, image)
    return image


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
@pytest.mark.parametrize("name", CONVERTED)
def test_what_qemu_reads_at_zero_is_captured_from_qemu_img_images(
    uefi_disk: Path, workdir: Path, name: str, chunk_bytes: int
) -> None:
    image = converted(uefi_disk, name, workdir)
    first = captured_from(image, chunk_bytes)
    assert first == qemu_reads_at_zero(image, CONVERTED[name][0])
    assert first == uefi_disk.read_bytes()[:FIRST_SECTORS_BYTES]
    assert boot_need(first) is BootNeed.UEFI_ONLY


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
def test_the_projects_own_qcow2_with_its_tables_last_is_read_through_the_window(
    uefi_disk: Path, workdir: Path, chunk_bytes: int
) -> None:
    image = workdir / "own.qcow2"
    raw = uefi_disk.read_bytes()
    with image.open("w+b") as file:
        assert write_qcow2(chunked(raw, 1_000_000), len(raw), file) == Success(image.stat().st_size)
    first = captured_from(image, chunk_bytes)
    assert first == qemu_reads_at_zero(image, "qcow2") == raw[:FIRST_SECTORS_BYTES]
    assert boot_need(first) is BootNeed.UEFI_ONLY


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
def test_the_projects_own_stream_optimized_vmdk_is_read_by_its_markers(
    uefi_disk: Path, workdir: Path, chunk_bytes: int
) -> None:
    raw = uefi_disk.read_bytes()
    image = workdir / "own.vmdk"
    encoded = encode_stream_optimized(chunked(raw, 1_000_000), len(raw))
    image.write_bytes(ok(encoded.consumed_by(b"".join)))
    first = captured_from(image, chunk_bytes)
    assert first == qemu_reads_at_zero(image, "vmdk") == raw[:FIRST_SECTORS_BYTES]
    assert boot_need(first) is BootNeed.UEFI_ONLY


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_valid_image_of_the_corpus_gives_what_qemu_reads(workdir: Path, name: str) -> None:
    image = valid_image(name, workdir)
    first = captured_from(image.path, 65536 + 3)
    if name == "qcow2-zstd":
        assert first is None  # zstd clusters are not inflated here
    else:
        assert first == oracle_raw(image, workdir)[:FIRST_SECTORS_BYTES]


def test_a_small_disk_gives_all_it_holds(workdir: Path) -> None:
    raw = workdir / "small.raw"
    raw.write_bytes(random.Random(7).randbytes(3000))
    image = workdir / "small.qcow2"
    qemu_img("convert", "-f", "raw", "-O", "qcow2", "-c", raw, image)
    in_sectors = raw.read_bytes().ljust(3072, b"\0")  # qemu-img rounds a disk up to sectors
    assert captured_from(image) == qemu_reads_at_zero(image, "qcow2") == in_sectors
    assert captured_from(raw) == raw.read_bytes()
    assert captured([]) == b""


def test_unallocated_subclusters_read_as_zeros_whatever_their_host_cluster_holds(
    workdir: Path,
) -> None:
    image = workdir / "subclusters.qcow2"
    qemu_img("create", "-f", "qcow2", "-o", "extended_l2=on,cluster_size=128k", image, "4M")
    subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", "write -P 0x41 8k 4k", str(image)],
        check=True,
        capture_output=True,
    )
    host = next(
        extent["offset"] - 8192
        for extent in _map(image)
        if extent["data"] and extent["start"] == 8192
    )
    data = bytearray(image.read_bytes())
    data[host : host + 8192] = b"\xee" * 8192  # the host cluster's unallocated subclusters 0, 1
    image.write_bytes(bytes(data))
    first = captured_from(image)
    assert first == qemu_reads_at_zero(image, "qcow2")
    assert first is not None
    assert first[8192:12288] == b"\x41" * 4096
    assert first.count(0) == FIRST_SECTORS_BYTES - 4096


def _map(image: Path) -> list[dict[str, int]]:
    extents: list[dict[str, int]] = json.loads(qemu_img("map", "--output=json", image))
    return extents


def hand_made_qcow2(data_cluster: int, l2_cluster: int, first_cluster: bytes) -> bytes:
    """A qcow2 of 64 KiB clusters whose guest cluster 0 lies at `data_cluster`, mapped by the
    L2 table at `l2_cluster` (the L1 table at cluster 1, refcounts unread by a reader)."""
    clusters = max(data_cluster, l2_cluster) + 1
    image = bytearray(clusters * CLUSTER)
    struct.pack_into(
        ">4sIQIIQIIQQIIQQQQII", image, 0, b"QFI\xfb", 3, 0, 0, 16, 64 * MIB, 0, 1, CLUSTER,
        2 * CLUSTER, 1, 0, 0, 0, 0, 0, 4, 104,
    )  # fmt: skip
    struct.pack_into(">Q", image, CLUSTER, l2_cluster * CLUSTER | 1 << 63)
    struct.pack_into(">Q", image, l2_cluster * CLUSTER, data_cluster * CLUSTER | 1 << 63)
    image[data_cluster * CLUSTER : (data_cluster + 1) * CLUSTER] = first_cluster
    return bytes(image)


def test_data_before_its_table_is_found_within_the_window_and_not_beyond(
    workdir: Path, uefi_disk: Path
) -> None:
    first_cluster = uefi_disk.read_bytes()[:CLUSTER]
    within = workdir / "within.qcow2"
    within.write_bytes(hand_made_qcow2(WINDOW_BYTES // CLUSTER - 1, 40, first_cluster))
    assert captured_from(within, 4099) == qemu_reads_at_zero(within, "qcow2") == first_cluster
    beyond = workdir / "beyond.qcow2"
    beyond.write_bytes(hand_made_qcow2(WINDOW_BYTES // CLUSTER, 40, first_cluster))
    assert qemu_reads_at_zero(beyond, "qcow2") == first_cluster
    assert captured_from(beyond, 4099) is None


def test_tables_and_data_past_the_images_end_read_as_zeros_as_qemu_reads_them(
    uefi_disk: Path, workdir: Path
) -> None:
    image = workdir / "cut.qcow2"
    whole = hand_made_qcow2(3, 2, uefi_disk.read_bytes()[:CLUSTER])
    for end in (3 * CLUSTER + 100, 2 * CLUSTER + 3, CLUSTER + 5):
        image.write_bytes(whole[:end])
        assert captured_from(image, 4099) == qemu_reads_at_zero(image, "qcow2")


def test_an_image_with_a_backing_file_is_none(uefi_disk: Path, workdir: Path) -> None:
    overlay = workdir / "overlay.qcow2"
    qemu_img("create", "-f", "qcow2", "-b", uefi_disk, "-F", "raw", overlay)
    assert captured_from(overlay) is None


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_images_of_the_corpus_never_raise(workdir: Path, name: str) -> None:
    image = hostile_image(name, workdir)
    first = captured_from(image.path, 65536 + 3)
    assert first is None or len(first) <= FIRST_SECTORS_BYTES


BENT = (
    "qcow2",
    "qcow2-compressed",
    "qcow2-extended-l2",
    "vmdk-stream-optimized",
    "vmdk-monolithic-sparse",
)


@pytest.fixture(scope="module")
def small_images(workdir: Path) -> dict[str, bytes]:
    """A few images of a small disk, to bend."""
    raw = workdir / "bent-source.raw"
    raw.write_bytes(random.Random(3).randbytes(100_000).ljust(MIB, b"\0"))
    (workdir / "bent").mkdir()
    return {name: converted(raw, name, workdir / "bent").read_bytes() for name in BENT}


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(BENT),
    bends=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 1024), st.integers(0, 300_000)),
            st.binary(min_size=1, max_size=8),
        ),
        min_size=1,
        max_size=4,
    ),
    chunk_bytes=st.sampled_from([511, 4099, 65536]),
)
def test_images_with_bent_headers_never_raise(
    small_images: dict[str, bytes], name: str, bends: list[tuple[int, bytes]], chunk_bytes: int
) -> None:
    image = bytearray(small_images[name])
    for offset, value in bends:
        image[offset : offset + len(value)] = value
    first = captured(chunked(bytes(image), chunk_bytes))
    assert first is None or len(first) <= FIRST_SECTORS_BYTES


@settings(max_examples=300, deadline=None)
@given(
    magic=st.sampled_from([b"QFI\xfb", b"KDMV", b""]),
    body=st.binary(max_size=4096),
    chunk_bytes=st.integers(1, 700),
)
def test_arbitrary_bytes_never_raise(magic: bytes, body: bytes, chunk_bytes: int) -> None:
    first = captured(chunked(magic + body, chunk_bytes))
    assert first is None or len(first) <= FIRST_SECTORS_BYTES


@pytest.mark.parametrize("name", CONVERTED)
def test_a_disk_whose_first_sectors_were_never_written_gives_zeros(
    workdir: Path, name: str
) -> None:
    raw = workdir / "late-data.raw"
    if not raw.exists():
        raw.write_bytes(bytes(40 * MIB) + random.Random(9).randbytes(MIB))
    (workdir / "late").mkdir(exist_ok=True)
    image = converted(raw, name, workdir / "late")
    first = captured_from(image)
    assert first == qemu_reads_at_zero(image, CONVERTED[name][0]) == bytes(FIRST_SECTORS_BYTES)
    assert boot_need(first) is BootNeed.UNKNOWN
