"""The judge and qemu agree on qcow2 headers and compressed clusters: each header field bent one
way or another, qemu-img (7.2, the one in the pod) is asked whether it opens the image, and the
judge refuses exactly the images qemu refuses to open; each compressed cluster bent the way a
full read or qemu-img check refuses is refused by the judge too."""

from __future__ import annotations

import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from pyrigaud.domain.errors import ErrorKind

from support import error_of, ok
from support.image_corpus import HOSTILE, VALID, hostile_image, valid_image
from support.judging import judged

Bend = Callable[[bytearray], None]


def _put(layout: str, offset: int, *values: int) -> Bend:
    def bend(data: bytearray) -> None:
        struct.pack_into(layout, data, offset, *values)

    return bend


def _both(*bends: Bend) -> Bend:
    def bend(data: bytearray) -> None:
        for one in bends:
            one(data)

    return bend


V3, SMALL = "qcow2-v3", "qcow2-512-byte-clusters"  # 64 KiB clusters, 512-byte clusters
HEADER_LENGTH, FEATURES, EXTENSION = 100, 72, 112
# Each bend of a qemu-img made image: the image it bends, and the bend.
BENDS: dict[str, tuple[str, Bend]] = {
    "header-longer-than-its-cluster": (SMALL, _put(">I", HEADER_LENGTH, 1024)),
    "header-as-long-as-its-cluster": (SMALL, _put(">I", HEADER_LENGTH, 512)),
    "header-of-a-whole-64-kib-cluster": (V3, _put(">I", HEADER_LENGTH, 65536)),
    "header-shorter-than-version-3": (V3, _put(">I", HEADER_LENGTH, 100)),
    "header-of-105-bytes": (V3, _put(">I", HEADER_LENGTH, 105)),
    "refcounts-of-2-pow-7-bits": (V3, _put(">I", 96, 7)),
    "compression-zstd-without-its-bit": (V3, _put(">B", 104, 1)),
    "compression-type-2": (V3, _both(_put(">B", 104, 2), _put(">Q", FEATURES, 1 << 3))),
    "compression-zlib-with-the-zstd-bit": (V3, _put(">Q", FEATURES, 1 << 3)),
    "no-refcount-table": (V3, _put(">I", 56, 0)),
    "refcount-table-of-8-mib": (V3, _put(">I", 56, 128)),
    "refcount-table-above-8-mib": (V3, _put(">I", 56, 129)),
    "snapshot-table-above-65536": (V3, _put(">I", 60, 65537)),
    "snapshot-table-off-a-cluster": (V3, _put(">Q", 64, 8)),
    "l1-table-off-a-cluster-for-no-disk": (
        V3,
        _both(_put(">Q", 40, 8), _put(">I", 36, 0), _put(">Q", 24, 0)),
    ),
    "extended-l2-of-512-byte-clusters": (SMALL, _put(">Q", FEATURES, 1 << 4)),
    "encryption-method-3": (V3, _put(">I", 32, 3)),
    "extension-larger-than-the-cluster": (V3, _put(">II", EXTENSION, 0x1234, 65536 - 119)),
    "extension-to-the-clusters-end": (V3, _put(">II", EXTENSION, 0x1234, 65536 - 120)),
    "extension-unknown": (V3, _put(">II", EXTENSION, 0x1234, 8)),
    "backing-format-of-16-bytes": (V3, _put(">II", EXTENSION, 0xE2792ACA, 16)),
    "luks-extension-unencrypted": (V3, _put(">II", EXTENSION, 0x0537BE77, 16)),
    "bitmaps-extension-of-8-bytes": (V3, _put(">II", EXTENSION, 0x23852875, 8)),
    "autoclear-features": (V3, _put(">Q", 88, 1 << 40)),
    "compatible-features": (V3, _put(">Q", 80, 1 << 40)),
    "dirty": (V3, _put(">Q", FEATURES, 1)),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def qemu_opens(path: Path) -> bool:
    return (
        subprocess.run(
            ["qemu-img", "info", "-f", "qcow2", str(path)], check=False, capture_output=True
        ).returncode
        == 0
    )


def qemu_reads_it_all(path: Path) -> bool:
    """Whether qemu-img check finds no corruption and a conversion reads every cluster."""
    checked = subprocess.run(
        ["qemu-img", "check", "-f", "qcow2", str(path)], check=False, capture_output=True
    )
    converted = subprocess.run(
        ["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(path), str(path) + ".raw"],
        check=False,
        capture_output=True,
    )
    return checked.returncode in (0, 3) and converted.returncode == 0  # 3: leaks only


@pytest.mark.parametrize("name", sorted(BENDS))
def test_the_judge_takes_a_qcow2_header_exactly_when_qemu_does(corpus: Path, name: str) -> None:
    """Refused when qemu does not open it (or, opened, qemu-img check finds it corrupt or a
    full read fails: a table the header places a cluster past the file's end)."""
    base, bend = BENDS[name]
    data = bytearray(valid_image(base, corpus).path.read_bytes())
    bend(data)
    image = corpus / f"{name}.qcow2"
    image.write_bytes(bytes(data))
    verdict = judged(image)
    if qemu_opens(image) and qemu_reads_it_all(image):
        assert ok(verdict).format == "qcow2"
    else:
        refused = error_of(verdict)
        assert refused.kind is ErrorKind.INVALID_SPEC
        assert "source_url" in refused.message


COMPRESSED = sorted(name for name in HOSTILE if name.startswith("qcow2-compressed"))


@pytest.mark.parametrize("name", COMPRESSED)
def test_a_compressed_cluster_qemu_cannot_read_is_refused(corpus: Path, name: str) -> None:
    image = hostile_image(name, corpus)
    assert not qemu_reads_it_all(image.path)
    assert ok(judged(valid_image(HOSTILE[name][0], corpus).path)).keepable_qcow2
    refused = error_of(judged(image.path))
    assert refused.kind is ErrorKind.INVALID_SPEC
    assert "compressed cluster" in refused.message or "past its end" in refused.message


def test_a_compressed_cluster_inflating_past_its_cluster_is_read_as_qemu_reads_it(
    corpus: Path,
) -> None:
    """qemu takes the first cluster the bytes inflate to and reads no further: so does the
    judge. (Bytes that inflate to two clusters, in place of the image's last compressed
    cluster.)"""
    data = bytearray(valid_image("qcow2-zlib", corpus).path.read_bytes())
    (l1_offset,) = struct.unpack_from(">Q", data, 40)
    l2_offset = struct.unpack_from(">Q", data, l1_offset)[0] & 0x00FFFFFFFFFFFE00
    entries = struct.unpack_from(">8192Q", data, l2_offset)
    index = max(
        (index for index, entry in enumerate(entries) if entry & 1 << 62),
        key=lambda index: entries[index] & (1 << 54) - 1,
    )
    offset = entries[index] & (1 << 54) - 1
    deflater = zlib.compressobj(9, zlib.DEFLATED, -12)
    longer = deflater.compress(b"\xa5" * 131072) + deflater.flush()
    assert offset + len(longer) < l2_offset or l2_offset + 65536 <= offset
    data[offset : offset + len(longer)] = longer
    sectors = (offset % 512 + len(longer) - 1) // 512
    struct.pack_into(">Q", data, l2_offset + index * 8, 1 << 62 | sectors << 54 | offset)
    image = corpus / "compressed-cluster-inflating-past-its-cluster.qcow2"
    image.write_bytes(bytes(data))
    assert qemu_reads_it_all(image)
    assert ok(judged(image)).keepable_qcow2


def _entry_bit(kind: str, bit: int) -> Bend:
    """A bit set in the first L1 entry, the first allocated L2 entry, or the first refcount
    table entry."""

    def bend(data: bytearray) -> None:
        (l1_offset,) = struct.unpack_from(">Q", data, 40)
        if kind == "refcount":
            at = struct.unpack_from(">Q", data, 48)[0]
        elif kind == "L1":
            at = l1_offset
        else:
            l2_offset = struct.unpack_from(">Q", data, l1_offset)[0] & 0x00FFFFFFFFFFFE00
            entries = struct.unpack_from(">8192Q", data, l2_offset)
            at = l2_offset + 8 * next(index for index, entry in enumerate(entries) if entry)
        (entry,) = struct.unpack_from(">Q", data, at)
        struct.pack_into(">Q", data, at, entry | 1 << bit)

    return bend


ENTRY_BITS = {
    "l1-entry-bit-1": _entry_bit("L1", 1),
    "l1-entry-bit-60": _entry_bit("L1", 60),
    "l2-entry-bit-1": _entry_bit("L2", 1),
    "l2-entry-bit-57": _entry_bit("L2", 57),
    "l2-entry-zero-flag": _entry_bit("L2", 0),
    "refcount-table-entry-bit-3": _entry_bit("refcount", 3),
}


@pytest.mark.parametrize("name", sorted(ENTRY_BITS))
def test_a_kept_qcow2_table_entry_is_taken_exactly_when_qemu_img_check_takes_it(
    corpus: Path, name: str
) -> None:
    """Reserved bits set in a table entry: qemu-img check finds the image corrupt, the judge
    refuses it; the zero flag, which is no reserved bit, both take."""
    data = bytearray(valid_image(V3, corpus).path.read_bytes())
    ENTRY_BITS[name](data)
    image = corpus / f"{name}.qcow2"
    image.write_bytes(bytes(data))
    verdict = judged(image)
    if qemu_reads_it_all(image):
        assert ok(verdict).keepable_qcow2
    else:
        assert "reserved bits" in error_of(verdict).message


@pytest.mark.parametrize("name", sorted(name for name in VALID if name.startswith("qcow2")))
def test_every_valid_qcow2_passes(corpus: Path, name: str) -> None:
    assert ok(judged(valid_image(name, corpus).path)).format == "qcow2"
