"""The tables of a qcow2 kept as it is, checked as its bytes stream past, as qemu reads them:
every plain image qemu-img (or pyrigaud's own writer) makes passes, and each entry bent the
way qemu refuses as corrupt is named, as qemu names it when it reads through the image,
however the bytes are cut into chunks."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from pyrigaud.adapters.disk_images.qcow2 import write_qcow2
from pyrigaud.adapters.disk_images.qcow2_tables import HELD_BYTES, OFFSET_MASK, Qcow2TableCheck

from support.image_corpus import hostile_image, valid_image
from support.judging import table_check_fed

# The corpus's plain qcow2 images (no snapshots, no incompatible feature) whose L1 table ends
# within the bytes held: all but the one of 2 MiB clusters, whose L1 table is its fourth.
WATCHED = (
    "qcow2-v2",
    "qcow2-v3",
    "qcow2-512-byte-clusters",
    "qcow2-zlib",
    "qcow2-lazy-refcounts",
)
# Whole; a cluster and 3 bytes, and 4099 bytes: the header, and tables' entries, cut at chunk
# edges.
CHUNKINGS = (1 << 40, 65536 + 3, 4099)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def checked(image: bytes, chunk_bytes: int = CHUNKINGS[0]) -> Qcow2TableCheck:
    return table_check_fed(image, chunk_bytes)


def problem_of(image: bytes, chunk_bytes: int = CHUNKINGS[0]) -> str | None:
    check = checked(image, chunk_bytes)
    assert check.watching
    return check.problem()


def qemu_reads_it_whole(path: Path) -> subprocess.CompletedProcess[str]:
    out = path.with_suffix(".raw")
    return subprocess.run(
        ["qemu-img", "convert", "-O", "raw", str(path), str(out)],
        check=False,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
@pytest.mark.parametrize("name", WATCHED)
def test_every_plain_image_qemu_img_makes_passes(corpus: Path, name: str, chunk_bytes: int) -> None:
    assert problem_of(valid_image(name, corpus).path.read_bytes(), chunk_bytes) is None


def test_the_images_pyrigauds_own_writer_makes_are_watched_and_pass(tmp_path: Path) -> None:
    """A vSphere export's qcow2 (its L1 table is its second cluster, each L2 table after the
    data it maps) is what a libvirt import most often keeps as it is."""
    mib = 1 << 20
    data_at = (0, 700, 1024)  # MiB: L2 tables 0, 1 and 2 (each maps 512 MiB)
    chunks = (b"\x01" * mib if at in data_at else bytes(mib) for at in range(1025))
    image = tmp_path / "exported.qcow2"
    with image.open("w+b") as file:
        write_qcow2(chunks, 1025 * mib, file)
    content = image.read_bytes()
    assert problem_of(content, 65536 + 3) is None
    bent = bytearray(content)
    (l1_offset,) = struct.unpack_from(">Q", bent, 40)
    (l2_offset,) = struct.unpack_from(">Q", bent, l1_offset + 16)  # the third L2 table
    l2_offset &= OFFSET_MASK
    (entry,) = struct.unpack_from(">Q", bent, l2_offset)
    struct.pack_into(">Q", bent, l2_offset, entry + 512)
    problem = problem_of(bytes(bent), 65536 + 3)
    assert problem is not None
    assert "places a data cluster off a cluster boundary" in problem


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
def test_a_data_cluster_off_a_cluster_boundary_is_what_qemu_refuses(
    corpus: Path, chunk_bytes: int
) -> None:
    image = hostile_image("qcow2-l2-entry-misaligned", corpus)
    assert "Cluster allocation offset" in qemu_reads_it_whole(image.path).stderr
    problem = problem_of(image.path.read_bytes(), chunk_bytes)
    assert problem is not None
    assert "L2 table places a data cluster off a cluster boundary" in problem


@pytest.mark.parametrize(
    ("table", "qemu_says", "named"),
    [
        (40, "L2 table offset", "L2 table 0 does not start on a cluster"),  # an L1 entry
        (48, "Refblock offset", "refcount block 0 does not start on a cluster"),
    ],
)
@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
def test_a_table_off_a_cluster_boundary_is_what_qemu_refuses(
    corpus: Path, table: int, qemu_says: str, named: str, chunk_bytes: int
) -> None:
    """The first entry of the L1 table (its offset at header byte 40) or of the refcount
    table (at byte 48) moved a sector past the cluster it names."""
    path = corpus / f"bent-{table}-{chunk_bytes}.qcow2"
    content = bytearray(valid_image("qcow2-v3", corpus).path.read_bytes())
    (where,) = struct.unpack_from(">Q", content, table)
    (entry,) = struct.unpack_from(">Q", content, where)
    assert entry & OFFSET_MASK
    struct.pack_into(">Q", content, where, entry + 512)
    path.write_bytes(bytes(content))
    assert qemu_says in qemu_reads_it_whole(path).stderr + _written_to(path)
    problem = problem_of(bytes(content), chunk_bytes)
    assert problem is not None
    assert named in problem


def _written_to(path: Path) -> str:
    """What qemu says when it must allocate (a refcount block is read only then)."""
    return subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", "write 0 64k", "-c", "write 100M 64k", str(path)],
        check=False,
        capture_output=True,
        text=True,
    ).stderr


def test_tables_a_cluster_past_the_images_end_are_what_qemu_img_check_refuses(
    corpus: Path,
) -> None:
    """qemu reads zeros past a file's end, but qemu-img check counts every table and cluster
    in use, and finds one that lies a cluster or more past the end corrupt: an image cut after
    its header is refused, one cut inside its last cluster is not."""
    image = valid_image("qcow2-v3", corpus).path
    content = image.read_bytes()
    cut = corpus / "cut-after-its-header.qcow2"
    cut.write_bytes(content[:512])
    assert qemu_checks(cut).returncode == 2
    assert "a cluster or more past its end" in (problem_of(content[:512]) or "")
    inside_last = corpus / "cut-inside-its-last-cluster.qcow2"
    inside_last.write_bytes(content[:-512])
    assert qemu_checks(inside_last).returncode == 0
    assert problem_of(content[:-512]) is None


def qemu_checks(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["qemu-img", "check", "-f", "qcow2", str(path)],
        check=False,
        capture_output=True,
        text=True,
    )


def test_an_image_whose_l1_table_ends_past_the_held_bytes_is_not_watched(corpus: Path) -> None:
    """Its L2 tables could pass before the L1 table names them: it is converted instead."""
    content = valid_image("qcow2-2-mib-clusters", corpus).path.read_bytes()
    (l1_offset,) = struct.unpack_from(">Q", content, 40)
    assert l1_offset > HELD_BYTES
    check = checked(content)
    assert not check.watching
    assert check.problem() is None


def test_bytes_that_are_not_a_qcow2_are_not_watched() -> None:
    check = checked(b"KDMV" + bytes(1 << 20))
    assert not check.watching


def _extended_l2_image(path: Path, *writes: str) -> bytes:
    """A qcow2 with extended L2 entries (64 KiB clusters, 32 subclusters of 2 KiB), written
    by qemu-io's `writes`."""
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-o", "extended_l2=on", str(path), "4M"],
        check=True,
    )
    commands = [part for write in writes for part in ("-c", write)]
    subprocess.run(
        ["qemu-io", "-f", "qcow2", *commands, str(path)], check=True, capture_output=True
    )
    return path.read_bytes()


def _first_l2_table(content: bytes | bytearray) -> int:
    (l1_offset,) = struct.unpack_from(">Q", content, 40)
    (l1_entry,) = struct.unpack_from(">Q", content, l1_offset)
    return int(l1_entry & OFFSET_MASK)


@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
def test_an_image_with_extended_l2_entries_is_watched_and_passes(
    tmp_path: Path, chunk_bytes: int
) -> None:
    """Subclusters allocated, zeroed and left out, side by side, and compressed clusters: the
    16-byte entries are read as qemu reads them."""
    content = _extended_l2_image(
        tmp_path / "extended.qcow2",
        "write -P 1 0 4k",
        "write -z 64k 2k",
        "write -P 2 130k 6k",
        "write -c -P 3 1M 64k",
    )
    assert qemu_checks(tmp_path / "extended.qcow2").returncode == 0
    assert problem_of(content, chunk_bytes) is None


@pytest.mark.parametrize(
    ("entry", "bitmap"),
    [
        # A data cluster whose first subcluster is both allocated and zero.
        (None, 0x00000001_00000001),
        # An unallocated cluster with an allocated subcluster.
        (0, 0x00000000_00000002),
        # A compressed cluster (its offset at the second cluster, one sector) with a bitmap.
        ((1 << 62) | 0x10000, 0x00000000_00000001),
    ],
)
@pytest.mark.parametrize("chunk_bytes", CHUNKINGS)
def test_a_subcluster_bitmap_a_cluster_cannot_have_is_what_qemu_img_check_refuses(
    tmp_path: Path, entry: int | None, bitmap: int, chunk_bytes: int
) -> None:
    path = tmp_path / "bent.qcow2"
    content = bytearray(_extended_l2_image(path, "write -P 1 0 4k"))
    l2_table = _first_l2_table(content)
    if entry is not None:
        struct.pack_into(">Q", content, l2_table, entry)
    struct.pack_into(">Q", content, l2_table + 8, bitmap)
    path.write_bytes(bytes(content))
    assert qemu_checks(path).returncode == 2
    problem = problem_of(bytes(content), chunk_bytes)
    assert problem is not None
    assert "extended L2 entry 0 has a subcluster bitmap" in problem


def test_the_extended_l2_bit_on_an_image_written_without_it_is_what_qemu_refuses(
    corpus: Path,
) -> None:
    """qemu then reads each pair of entries as an entry and its bitmap."""
    path = corpus / "extended-bit-set.qcow2"
    content = bytearray(valid_image("qcow2-v3", corpus).path.read_bytes())
    (features,) = struct.unpack_from(">Q", content, 72)
    struct.pack_into(">Q", content, 72, features | 1 << 4)
    path.write_bytes(bytes(content))
    assert qemu_reads_it_whole(path).returncode != 0
    assert "has a subcluster bitmap" in (problem_of(bytes(content)) or "")
