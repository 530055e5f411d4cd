"""The tables of a qcow2 kept as it is, checked as qemu reads them: every plain image qemu-img
makes passes, and each entry bent the way qemu refuses as corrupt is named, as qemu names it
when it reads through the image."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from pyrigaud.adapters.disk_images.qcow2_tables import OFFSET_MASK, qcow2_tables_problem

from support.image_corpus import hostile_image, valid_image

# The corpus's qcow2 images the judge passes as plain (no snapshots, no incompatible feature).
PLAIN = (
    "qcow2-v2",
    "qcow2-v3",
    "qcow2-512-byte-clusters",
    "qcow2-2-mib-clusters",
    "qcow2-zlib",
    "qcow2-lazy-refcounts",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def problem_of(image: bytes) -> str | None:
    return qcow2_tables_problem(lambda offset, length: image[offset : offset + length])


def qemu_reads_it_whole(path: Path) -> subprocess.CompletedProcess[str]:
    out = path.with_suffix(".raw")
    return subprocess.run(
        ["qemu-img", "convert", "-O", "raw", str(path), str(out)],
        check=False,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("name", PLAIN)
def test_every_plain_image_qemu_img_makes_passes(corpus: Path, name: str) -> None:
    assert problem_of(valid_image(name, corpus).path.read_bytes()) is None


def test_a_data_cluster_off_a_cluster_boundary_is_what_qemu_refuses(corpus: Path) -> None:
    image = hostile_image("qcow2-l2-entry-misaligned", corpus)
    assert "Cluster allocation offset" in qemu_reads_it_whole(image.path).stderr
    problem = problem_of(image.path.read_bytes())
    assert problem is not None
    assert "L2 table 0 places a data cluster off a cluster boundary" in problem


@pytest.mark.parametrize(
    ("table", "qemu_says", "named"),
    [
        (40, "L2 table offset", "L2 table 0 does not start on a cluster"),  # an L1 entry
        (48, "Refblock offset", "refcount block 0 does not start on a cluster"),
    ],
)
def test_a_table_off_a_cluster_boundary_is_what_qemu_refuses(
    corpus: Path, table: int, qemu_says: str, named: str
) -> None:
    """The first entry of the L1 table (its offset at header byte 40) or of the refcount
    table (at byte 48) moved a sector past the cluster it names."""
    path = corpus / f"bent-{table}.qcow2"
    content = bytearray(valid_image("qcow2-v3", corpus).path.read_bytes())
    (where,) = struct.unpack_from(">Q", content, table)
    (entry,) = struct.unpack_from(">Q", content, where)
    assert entry & OFFSET_MASK
    struct.pack_into(">Q", content, where, entry + 512)
    path.write_bytes(bytes(content))
    assert qemu_says in qemu_reads_it_whole(path).stderr + _written_to(path)
    problem = problem_of(bytes(content))
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


def test_tables_past_the_images_end_read_as_zeros(corpus: Path) -> None:
    """qemu reads zeros past a file's end: an image cut after its header has no table entry
    to refuse (its data reads as zeros, as qemu reads it)."""
    content = valid_image("qcow2-v3", corpus).path.read_bytes()
    assert problem_of(content[:512]) is None
