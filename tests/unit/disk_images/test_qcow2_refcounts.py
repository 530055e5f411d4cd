"""The refcounts of a qcow2 kept as it is, counted against its tables as the bytes stream past,
as `qemu-img check` counts them: every refcount width qemu-img writes passes, and a refcount
below its references, or a copied flag that disagrees with a refcount, is named, as qemu-img
check names it, however the bytes are cut into chunks."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from returns.result import Success

from pyrigaud.adapters.disk_images.inspection import InspectingJudge
from pyrigaud.adapters.disk_images.qcow2_refcounts import (
    MAX_CLUSTERS,
    RefcountBalance,
    countable_disk,
)
from pyrigaud.adapters.disk_images.qcow2_tables import COPIED, OFFSET_MASK, Qcow2TableCheck

from support.image_corpus import source_disk, valid_image
from support.judging import table_check_fed

CHUNKINGS = (1 << 40, 65536 + 3, 4099)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def checked(image: bytes, chunk_bytes: int = CHUNKINGS[0]) -> Qcow2TableCheck:
    check = table_check_fed(image, chunk_bytes)
    assert check.watching
    return check


def qemu_checks(image: bytes, path: Path) -> str:
    path.write_bytes(image)
    checked_out = subprocess.run(
        ["qemu-img", "check", "-f", "qcow2", str(path)],
        check=False,
        capture_output=True,
        text=True,
    )
    return checked_out.stdout + checked_out.stderr


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
@pytest.mark.parametrize("refcount_bits", [1, 2, 4, 8, 16, 32, 64])
def test_every_refcount_width_qemu_img_writes_is_counted_and_passes(
    corpus: Path, refcount_bits: int, chunk_bytes: int
) -> None:
    path = corpus / f"refcount-bits-{refcount_bits}.qcow2"
    if not path.exists():
        options = f"refcount_bits={refcount_bits},cluster_size=4096"
        source = str(source_disk(corpus))
        subprocess.run(
            ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-o", options, source, str(path)],
            check=True,
            capture_output=True,
        )
    assert checked(path.read_bytes(), chunk_bytes).problem() is None


def _first_data_cluster(image: bytes) -> tuple[int, int]:
    """(where its L2 entry lies, the entry) of the first data cluster of a qemu-img image."""
    (l1_offset,) = struct.unpack_from(">Q", image, 40)
    (l1_entry,) = struct.unpack_from(">Q", image, l1_offset)
    l2_offset = l1_entry & OFFSET_MASK
    for where in range(l2_offset, l2_offset + 65536, 8):
        (entry,) = struct.unpack_from(">Q", image, where)
        if entry & OFFSET_MASK:
            return where, entry
    raise AssertionError("no data cluster")


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
def test_a_data_cluster_whose_refcount_is_zero_is_what_qemu_img_check_refuses(
    corpus: Path, chunk_bytes: int
) -> None:
    image = bytearray(valid_image("qcow2-v3", corpus).path.read_bytes())
    _where, entry = _first_data_cluster(bytes(image))
    cluster = (entry & OFFSET_MASK) >> 16
    (table,) = struct.unpack_from(">Q", image, 48)
    (block,) = struct.unpack_from(">Q", image, table)
    struct.pack_into(">H", image, block + 2 * cluster, 0)
    assert f"ERROR cluster {cluster} refcount=0 reference=1" in qemu_checks(
        bytes(image), corpus / f"refcount-zero-{chunk_bytes}.qcow2"
    )
    problem = checked(bytes(image), chunk_bytes).problem()
    assert problem == (
        f"the qcow2 image's cluster {cluster} has a refcount below its references "
        "(qemu-img check finds it corrupt)"
    )


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
def test_a_copied_flag_that_disagrees_with_the_refcount_is_what_qemu_img_check_refuses(
    corpus: Path, chunk_bytes: int
) -> None:
    image = bytearray(valid_image("qcow2-v3", corpus).path.read_bytes())
    where, entry = _first_data_cluster(bytes(image))
    struct.pack_into(">Q", image, where, entry & ~COPIED)
    assert "ERROR OFLAG_COPIED data cluster" in qemu_checks(
        bytes(image), corpus / f"not-copied-{chunk_bytes}.qcow2"
    )
    problem = checked(bytes(image), chunk_bytes).problem()
    assert problem is not None
    assert "is not flagged copied but its refcount is one" in problem


def test_a_zero_cluster_in_a_version_2_image_is_refused(corpus: Path) -> None:
    """qemu: "Zero cluster entry found in pre-v3 image"."""
    image = bytearray(valid_image("qcow2-v2", corpus).path.read_bytes())
    where, entry = _first_data_cluster(bytes(image))
    struct.pack_into(">Q", image, where, entry | 1)
    problem = checked(bytes(image)).problem()
    assert problem is not None
    assert "zero cluster, which a version 2 image cannot have" in problem


def test_a_cluster_in_use_past_the_bound_is_refused() -> None:
    """Only a file of fewer than MAX_CLUSTERS clusters (of unknown size: a disk of at most
    half as many) is kept: one that uses a cluster past MAX_CLUSTERS anyway is refused."""
    assert countable_disk((MAX_CLUSTERS // 2) << 16, None, 16)
    assert not countable_disk((MAX_CLUSTERS // 2 + 1) << 16, None, 16)
    assert countable_disk(1 << 40, 10 << 30, 16)  # a sparse TiB disk in a file of 10 GiB
    assert not countable_disk(1 << 40, MAX_CLUSTERS << 16, 16)
    balance = RefcountBalance(cluster_bits=9)
    balance.referenced(0, 512)
    balance.referenced(MAX_CLUSTERS * 512, 512, copied=True)
    balance.refcounts(0, [1])
    assert not balance.countable
    assert "uses a cluster past" in (balance.problem() or "")


def test_refcount_blocks_before_the_table_that_names_them_are_not_compared(
    tmp_path: Path,
) -> None:
    """qemu moves a full refcount table after its blocks (here: 512-byte clusters, 25 MiB
    written): the blocks before it passed unread, their clusters are not compared, and the
    image passes."""
    path = tmp_path / "grown.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", str(path), "30M"],
        check=True,
    )
    subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", "write -P 7 0 25M", str(path)],
        check=True,
        capture_output=True,
    )
    image = path.read_bytes()
    (table,) = struct.unpack_from(">Q", image, 48)
    (first_block,) = struct.unpack_from(">Q", image, table)
    assert first_block < table
    assert "No errors were found" in qemu_checks(image, path)
    assert checked(image, 65536 + 3).problem() is None


def test_a_refcount_block_that_holds_anything_else_is_corrupt() -> None:
    balance = RefcountBalance(cluster_bits=9)
    balance.refcount_block(1024)
    balance.referenced(1024, 512)
    balance.refcounts(0, [0, 0, 2])
    assert balance.problem() == (
        "the qcow2 image's cluster 2 holds a refcount block and something else "
        "(qemu-img check finds it corrupt)"
    )


def test_a_dirty_image_a_crash_left_is_converted_not_refused(tmp_path: Path) -> None:
    """A VM that crashed with lazy refcounts leaves the dirty bit and stale refcounts, which
    qemu rebuilds when it opens the image for writing (qemu-img check reports them): the
    judge does not count them, and the image is converted rather than kept."""
    path = tmp_path / "crashed.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-o", "lazy_refcounts=on", str(path), "20M"],
        check=True,
    )
    crashed = subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", "write -P 1 0 3M", "-c", "abort", str(path)],
        check=False,
        capture_output=True,
    )
    assert crashed.returncode != 0
    image = path.read_bytes()
    assert "refcount=0 reference=1" in qemu_checks(image, path)
    inspection = InspectingJudge(1 << 30).inspect(len(image), "source_url")
    inspection.feed(image)
    match inspection.first_look().bind(lambda _: inspection.verdict()):
        case Success(judged):
            assert judged.format == "qcow2"
            assert not judged.keepable_qcow2
        case refused:
            raise AssertionError(refused)
